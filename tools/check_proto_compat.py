#!/usr/bin/env python3
"""Check that trtserve's protos are wire-compatible with tritonclient.

Compiles protos/inference/*.proto with grpc_tools.protoc into a temporary
directory, loads the result into a private DescriptorPool (so it does not
clash with tritonclient's modules, which register the same `inference.*`
names in the default pool), and compares it with the descriptors inside the
installed tritonclient.grpc.service_pb2 / model_config_pb2 modules:

  * every RPC of inference.GRPCInferenceService: name, request/response type,
    client/server streaming flags;
  * every message (nested ones and map entries included): presence on both
    sides, and for each field: name, number, type, label, packed-ness,
    presence, message/enum type name and oneof membership;
  * every enum: value names and numbers.

Reference-only fields and messages are tolerated only inside the ModelConfig
sub-messages that the field table (shared/notes/protocol.md b4) does not spell
out (LENIENT_ROOTS below). Anything we define must match exactly, and anything
missing from the service file (b1-b3) or from the listed ModelConfig parts is
an error.

Finally a round-trip test fills every field of every message we define,
serializes it with our classes, parses it with tritonclient's classes and
compares the decoded content.

Usage: python tools/check_proto_compat.py [-v] [--proto-root DIR]
Exit status: 0 if compatible, 1 on any mismatch, 2 if protoc fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_ROOT = os.path.join(REPO, "protos")
OUR_FILES = ["inference/grpc_service.proto", "inference/model_config.proto"]
SERVICE = "inference.GRPCInferenceService"

# ModelConfig sub-messages the field table does not describe in full. Inside
# these (and anything nested in them) the reference may have fields, messages
# and enum values we do not define. Fields we do define must still match.
LENIENT_ROOTS = (
    "inference.ModelOptimizationPolicy",
    "inference.ModelEnsembling",
    "inference.BatchInput",
    "inference.BatchOutput",
    "inference.ModelOperations",
    "inference.ModelRepositoryAgents",
    "inference.ModelMetrics",
    "inference.ModelSequenceBatching.Control",
    "inference.ModelSequenceBatching.ControlInput",
    "inference.ModelSequenceBatching.InitialState",
    "inference.ModelSequenceBatching.State",
    "inference.ModelInstanceGroup.SecondaryDevice",
)

TYPE_NAMES = {
    v: k[len("TYPE_"):].lower()
    for k, v in vars(FieldDescriptor).items()
    if k.startswith("TYPE_") and isinstance(v, int)
}


def is_lenient(full_name):
    return any(full_name == r or full_name.startswith(r + ".")
               for r in LENIENT_ROOTS)


# --------------------------------------------------------------------------
# Loading descriptors
# --------------------------------------------------------------------------

def compile_ours(outdir, proto_root=PROTO_ROOT):
    """Run protoc; return a DescriptorPool holding our files."""
    import importlib.resources

    from grpc_tools import protoc
    # Well-known types shipped with grpc_tools (not needed today, harmless).
    wkt = str(importlib.resources.files("grpc_tools") / "_proto")
    dset = os.path.join(outdir, "trtserve.desc")
    args = ["protoc", "-I", proto_root, "-I", wkt,
            "--python_out=" + outdir, "--grpc_python_out=" + outdir,
            "--descriptor_set_out=" + dset, "--include_imports"]
    args += [os.path.join(proto_root, f) for f in OUR_FILES]
    rc = protoc.main(args)
    if rc != 0:
        print("protoc failed with status %d" % rc)
        sys.exit(2)
    fds = descriptor_pb2.FileDescriptorSet()
    with open(dset, "rb") as f:
        fds.ParseFromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for fdp in fds.file:
        pool.Add(fdp)
    return pool


def check_generated_modules(outdir):
    """Import the generated *_pb2 / *_pb2_grpc modules in a clean process."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import inference.grpc_service_pb2 as s\n"
            "import inference.grpc_service_pb2_grpc as g\n"
            "import inference.model_config_pb2 as m\n"
            "assert hasattr(g, 'GRPCInferenceServiceServicer')\n"
            "assert hasattr(g, 'GRPCInferenceServiceStub')\n"
            "assert hasattr(g, 'add_GRPCInferenceServiceServicer_to_server')\n"
            % outdir)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True)
    return r.returncode == 0, (r.stderr or r.stdout).strip()


def walk_messages(containers):
    for md in containers:
        yield md
        yield from walk_messages(md.nested_types)


def collect(file_descs):
    msgs, enums = {}, {}
    for fd in file_descs:
        for md in walk_messages(fd.message_types_by_name.values()):
            msgs[md.full_name] = md
            for ed in md.enum_types:
                enums[ed.full_name] = ed
        for ed in fd.enum_types_by_name.values():
            enums[ed.full_name] = ed
    return msgs, enums


# --------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------

def label_of(f):
    if getattr(f, "is_repeated", None) is not None:
        return "repeated" if f.is_repeated else (
            "required" if f.is_required else "optional")
    return {1: "optional", 2: "required", 3: "repeated"}[f.label]


def field_sig(f):
    sub = None
    if f.message_type is not None:
        sub = f.message_type.full_name
    elif f.enum_type is not None:
        sub = f.enum_type.full_name
    return {
        "name": f.name,
        "type": TYPE_NAMES.get(f.type, f.type),
        "label": label_of(f),
        "packed": bool(f.is_packed),
        "presence": bool(f.has_presence),
        "type_name": sub,
        "oneof": f.containing_oneof.name if f.containing_oneof else None,
    }


class Report:
    def __init__(self):
        self.errors = []
        self.tolerated = []
        self.counts = dict(rpcs=0, messages=0, fields=0, enums=0,
                           enum_values=0, roundtrip=0)

    def err(self, msg):
        self.errors.append(msg)

    def tol(self, msg):
        self.tolerated.append(msg)


def compare_services(rep, our_pool, ref_file):
    ref_svc = ref_file.services_by_name.get("GRPCInferenceService")
    try:
        our_svc = our_pool.FindServiceByName(SERVICE)
    except KeyError:
        rep.err("service %s: missing on our side" % SERVICE)
        return
    ours = {m.name: m for m in our_svc.methods}
    refs = {m.name: m for m in ref_svc.methods}
    for name, rm in refs.items():
        om = ours.get(name)
        if om is None:
            rep.err("rpc %s: missing on our side" % name)
            continue
        rep.counts["rpcs"] += 1
        for attr in ("input_type", "output_type"):
            a, b = getattr(om, attr).full_name, getattr(rm, attr).full_name
            if a != b:
                rep.err("rpc %s: %s ours=%s reference=%s" % (name, attr, a, b))
        for attr in ("client_streaming", "server_streaming"):
            a, b = getattr(om, attr), getattr(rm, attr)
            if a != b:
                rep.err("rpc %s: %s ours=%s reference=%s" % (name, attr, a, b))
    for name in ours:
        if name not in refs:
            rep.err("rpc %s: defined by us but not by the reference" % name)


def compare_messages(rep, ours, refs):
    for name in sorted(set(ours) | set(refs)):
        om, rm = ours.get(name), refs.get(name)
        if om is None:
            if is_lenient(name):
                rep.tol("message %s (reference only)" % name)
            else:
                rep.err("message %s: missing on our side" % name)
            continue
        if rm is None:
            rep.err("message %s: defined by us but not by the reference" % name)
            continue
        rep.counts["messages"] += 1
        if om.GetOptions().map_entry != rm.GetOptions().map_entry:
            rep.err("message %s: map_entry differs" % name)
        ofields = {f.number: f for f in om.fields}
        rfields = {f.number: f for f in rm.fields}
        for num in sorted(set(ofields) | set(rfields)):
            of, rf = ofields.get(num), rfields.get(num)
            if of is None:
                desc = "field %s.%s = %d (reference only)" % (name, rf.name, num)
                if is_lenient(name):
                    rep.tol(desc)
                else:
                    rep.err(desc.replace("(reference only)",
                                         ": missing on our side"))
                continue
            if rf is None:
                rep.err("field %s.%s = %d: defined by us but not by the "
                        "reference" % (name, of.name, num))
                continue
            rep.counts["fields"] += 1
            osig, rsig = field_sig(of), field_sig(rf)
            for key in osig:
                if osig[key] != rsig[key]:
                    rep.err("field %s #%d (%s): %s ours=%r reference=%r"
                            % (name, num, of.name, key, osig[key], rsig[key]))
        # Oneof groups: same names, same members.
        oo = {o.name: sorted(f.number for f in o.fields) for o in om.oneofs}
        ro = {o.name: sorted(f.number for f in o.fields) for o in rm.oneofs}
        for oname in sorted(set(oo) | set(ro)):
            if oname not in oo:
                if not is_lenient(name):
                    rep.err("oneof %s.%s: missing on our side" % (name, oname))
                continue
            if oname not in ro:
                rep.err("oneof %s.%s: not in the reference" % (name, oname))
                continue
            extra = set(oo[oname]) - set(ro[oname])
            lacking = set(ro[oname]) - set(oo[oname])
            if extra:
                rep.err("oneof %s.%s: our extra members %s"
                        % (name, oname, sorted(extra)))
            if lacking and not is_lenient(name):
                rep.err("oneof %s.%s: members missing on our side %s"
                        % (name, oname, sorted(lacking)))


def compare_enums(rep, ours, refs):
    for name in sorted(set(ours) | set(refs)):
        oe, re_ = ours.get(name), refs.get(name)
        if oe is None:
            if is_lenient(name):
                rep.tol("enum %s (reference only)" % name)
            else:
                rep.err("enum %s: missing on our side" % name)
            continue
        if re_ is None:
            rep.err("enum %s: defined by us but not by the reference" % name)
            continue
        rep.counts["enums"] += 1
        ov = {v.number: v.name for v in oe.values}
        rv = {v.number: v.name for v in re_.values}
        for num in sorted(set(ov) | set(rv)):
            if num not in ov:
                d = "enum value %s.%s = %d" % (name, rv[num], num)
                if is_lenient(name):
                    rep.tol(d + " (reference only)")
                else:
                    rep.err(d + ": missing on our side")
            elif num not in rv:
                rep.err("enum value %s.%s = %d: not in the reference"
                        % (name, ov[num], num))
            else:
                rep.counts["enum_values"] += 1
                if ov[num] != rv[num]:
                    rep.err("enum value %s #%d: ours=%s reference=%s"
                            % (name, num, ov[num], rv[num]))


# --------------------------------------------------------------------------
# Round trip: our bytes -> reference parser
# --------------------------------------------------------------------------

_SCALARS = {
    FieldDescriptor.TYPE_BOOL: True,
    FieldDescriptor.TYPE_STRING: "s\u00e9",
    FieldDescriptor.TYPE_BYTES: b"\x00\xffb",
    FieldDescriptor.TYPE_FLOAT: 1.5,
    FieldDescriptor.TYPE_DOUBLE: -2.25,
    FieldDescriptor.TYPE_INT32: -7,
    FieldDescriptor.TYPE_SINT32: -7,
    FieldDescriptor.TYPE_SFIXED32: -7,
    FieldDescriptor.TYPE_INT64: -(2 ** 40),
    FieldDescriptor.TYPE_SINT64: -(2 ** 40),
    FieldDescriptor.TYPE_SFIXED64: -(2 ** 40),
    FieldDescriptor.TYPE_UINT32: 4000000000,
    FieldDescriptor.TYPE_FIXED32: 4000000000,
    FieldDescriptor.TYPE_UINT64: 2 ** 63 + 5,
    FieldDescriptor.TYPE_FIXED64: 2 ** 63 + 5,
}


def _scalar(f):
    if f.type == FieldDescriptor.TYPE_ENUM:
        vals = f.enum_type.values
        return vals[-1].number  # a non-default value
    return _SCALARS[f.type]


def fill(msg, depth=0):
    """Set every field of `msg` (one member per oneof: the last one)."""
    for f in msg.DESCRIPTOR.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            kf = f.message_type.fields_by_name["key"]
            vf = f.message_type.fields_by_name["value"]
            m = getattr(msg, f.name)
            key = _scalar(kf)
            if vf.message_type is not None:
                entry = m[key]  # creates the entry
                if depth < 4:
                    fill(entry, depth + 1)
            else:
                m[key] = _scalar(vf)
        elif f.message_type is not None:
            if depth >= 4:
                continue
            if label_of(f) == "repeated":
                fill(getattr(msg, f.name).add(), depth + 1)
                fill(getattr(msg, f.name).add(), depth + 1)
            else:
                sub = getattr(msg, f.name)
                sub.SetInParent()
                fill(sub, depth + 1)
        elif label_of(f) == "repeated":
            getattr(msg, f.name).extend([_scalar(f), _scalar(f)])
        else:
            setattr(msg, f.name, _scalar(f))
    return msg


def roundtrip(rep, our_msgs, ref_msgs):
    for name, od in sorted(our_msgs.items()):
        rd = ref_msgs.get(name)
        if rd is None or od.GetOptions().map_entry:
            continue
        ours = fill(message_factory.GetMessageClass(od)())
        wire = ours.SerializeToString(deterministic=True)
        ref = message_factory.GetMessageClass(rd)()
        try:
            ref.ParseFromString(wire)
        except Exception as e:  # noqa: BLE001
            rep.err("roundtrip %s: reference failed to parse: %s" % (name, e))
            continue
        a = json_format.MessageToDict(ours, preserving_proto_field_name=True)
        b = json_format.MessageToDict(ref, preserving_proto_field_name=True)
        if a != b:
            rep.err("roundtrip %s: decoded content differs\n  ours: %s\n  ref:  %s"
                    % (name, a, b))
            continue
        # And back: the reference's bytes parse to the same thing on our side.
        back = message_factory.GetMessageClass(od)()
        back.ParseFromString(ref.SerializeToString(deterministic=True))
        if json_format.MessageToDict(back, preserving_proto_field_name=True) != a:
            rep.err("roundtrip %s: reference -> ours differs" % name)
            continue
        rep.counts["roundtrip"] += 1


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="list every tolerated reference-only item")
    ap.add_argument("--proto-root", default=PROTO_ROOT,
                    help="directory holding inference/*.proto "
                         "(default: %(default)s)")
    args = ap.parse_args()

    try:
        import tritonclient
        from tritonclient.grpc import model_config_pb2 as ref_mc
        from tritonclient.grpc import service_pb2 as ref_svc
    except ImportError as e:
        print("cannot import tritonclient.grpc (pip install tritonclient[grpc]):",
              e)
        return 2

    rep = Report()
    with tempfile.TemporaryDirectory(prefix="trtserve-proto-") as tmp:
        pool = compile_ours(tmp, args.proto_root)
        ok, detail = check_generated_modules(tmp)
        if not ok:
            rep.err("generated python modules fail to import:\n" + detail)
        our_files = [pool.FindFileByName(f) for f in OUR_FILES]
        for fd in our_files:
            if fd.package != "inference":
                rep.err("%s: package %r, expected 'inference'"
                        % (fd.name, fd.package))

        ref_files = [ref_svc.DESCRIPTOR, ref_mc.DESCRIPTOR]
        our_msgs, our_enums = collect(our_files)
        ref_msgs, ref_enums = collect(ref_files)

        compare_services(rep, pool, ref_svc.DESCRIPTOR)
        compare_messages(rep, our_msgs, ref_msgs)
        compare_enums(rep, our_enums, ref_enums)
        roundtrip(rep, our_msgs, ref_msgs)

    version = getattr(tritonclient, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as _v
            version = _v("tritonclient")
        except Exception:  # noqa: BLE001
            version = "?"
    c = rep.counts
    print("reference: tritonclient %s (%s, %s)"
          % (version, ref_svc.DESCRIPTOR.name, ref_mc.DESCRIPTOR.name))
    print("checked: %d RPCs, %d messages, %d fields, %d enums (%d values), "
          "%d message round trips"
          % (c["rpcs"], c["messages"], c["fields"], c["enums"],
             c["enum_values"], c["roundtrip"]))
    print("tolerated reference-only items (ModelConfig parts not in the "
          "field table): %d" % len(rep.tolerated))
    if args.verbose:
        for t in rep.tolerated:
            print("  ~ " + t)
    else:
        roots = {}
        for t in rep.tolerated:
            full = t.split()[1] if not t.startswith("enum value") else t.split()[2]
            root = next((r for r in LENIENT_ROOTS
                         if full == r or full.startswith(r + ".")), full)
            roots[root] = roots.get(root, 0) + 1
        for r, n in sorted(roots.items()):
            print("  ~ %s: %d item(s)" % (r, n))
    if rep.errors:
        print("MISMATCHES: %d" % len(rep.errors))
        for e in rep.errors:
            print("  ! " + e)
        return 1
    print("OK: wire-compatible with tritonclient")
    return 0


if __name__ == "__main__":
    sys.exit(main())
