"""``trtserve policy MODEL``: read or change a running model's batching policy.

Calls the ``trtserve.v1.ModelControl`` RPC of a live server; only the flags given are
changed, and the change applies to the next batch the model's dispatcher forms.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from google.protobuf import json_format

FLAGS = {
    # flag → width of its BatchingPolicy field (unsigned)
    "max_batch_size": 32,
    "max_queue_delay_us": 64,
    "default_timeout_us": 64,
    "max_queue_size": 32,
    "priority_aging_us": 64,
}
SWITCHES = ("adaptive", "adaptive_batch_size", "length_bucketing")


def _unsigned(bits: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not 0 <= value < 1 << bits:
            raise argparse.ArgumentTypeError(f"must be in 0..{(1 << bits) - 1}, got {value}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model name")
    parser.add_argument("--url", default="127.0.0.1:8001", help="server address (default: 127.0.0.1:8001)")
    for field, bits in FLAGS.items():
        parser.add_argument(f"--{field.replace('_', '-')}", dest=field, type=_unsigned(bits), help=f"set {field}")
    for field in SWITCHES:
        parser.add_argument(f"--{field.replace('_', '-')}", dest=field, choices=["true", "false"], help=f"set {field}")


def run(args: argparse.Namespace) -> int:
    import grpc

    from trtserve._proto.trtserve.v1 import control_pb2 as pb
    from trtserve._proto.trtserve.v1 import control_pb2_grpc as pb_grpc

    stub = pb_grpc.ModelControlStub(grpc.insecure_channel(args.url))
    update = pb.BatchingPolicy()
    paths = []
    for field in (*FLAGS, *SWITCHES):
        value = getattr(args, field)
        if value is None:
            continue
        setattr(update, field, value == "true" if field in SWITCHES else value)
        paths.append(field)
    try:
        if paths:
            request = pb.SetPolicyRequest(model_name=args.model, policy=update)
            request.update_mask.paths.extend(paths)
            policy = stub.SetPolicy(request)
        else:
            policy = stub.GetPolicy(pb.GetPolicyRequest(model_name=args.model))
    except grpc.RpcError as exc:
        print(f"{exc.code().name}: {exc.details()}")
        return 1
    print(json_format.MessageToJson(policy, always_print_fields_with_no_presence=True,
                                    preserving_proto_field_name=True))
    return 0
