// trtserve C++ client example: stubs generated from protos/ at build time (see CMakeLists.txt).
//
//   trtserve_example HOST:PORT
//
// Runs three checks against a live server and exits non-zero if any fails:
//   1. unary ModelInfer on identity_fp32 (values equal) and tiny ([2,64] -> [2,16] FP32,
//      each row equal to the same row sent alone);
//   2. a 100-message ModelStreamInfer on identity_fp32: every id answered exactly once, with
//      its own values;
//   3. deadlines: a 1 µs `timeout` parameter and an already-expired gRPC deadline both give
//      DEADLINE_EXCEEDED.
// Tensors travel as raw little-endian bytes (raw_input_contents / raw_output_contents).

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "inference/grpc_service.grpc.pb.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "raw tensors are little-endian; add byte swapping for this host");

namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using inference::ModelStreamInferResponse;

// A ModelInferRequest with one FP32 input sent as raw bytes.
ModelInferRequest Fp32Request(const std::string& model, const std::string& input, const std::vector<int64_t>& shape,
                              const std::vector<float>& values, const std::string& id = "") {
  ModelInferRequest request;
  request.set_model_name(model);
  request.set_id(id);
  auto* tensor = request.add_inputs();
  tensor->set_name(input);
  tensor->set_datatype("FP32");
  for (int64_t dim : shape) tensor->add_shape(dim);
  request.add_raw_input_contents(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return request;
}

// The named FP32 output of a response (its shape into *shape).
std::vector<float> Fp32Output(const ModelInferResponse& response, const std::string& name, std::vector<int64_t>* shape) {
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& tensor = response.outputs(i);
    if (tensor.name() != name) continue;
    if (tensor.datatype() != "FP32") throw std::runtime_error(name + " is " + tensor.datatype() + ", not FP32");
    if (shape) shape->assign(tensor.shape().begin(), tensor.shape().end());
    const std::string& raw = response.raw_output_contents(i);
    std::vector<float> values(raw.size() / sizeof(float));
    std::memcpy(values.data(), raw.data(), raw.size());
    return values;
  }
  throw std::runtime_error("no output " + name);
}

std::string Describe(const grpc::Status& status) {
  std::ostringstream out;
  out << "status " << status.error_code() << ": " << status.error_message();
  return out.str();
}

#define CHECK(cond, what)                                                   \
  do {                                                                      \
    if (!(cond)) throw std::runtime_error(std::string("check failed: ") + (what)); \
  } while (0)

std::unique_ptr<grpc::ClientContext> Context(double seconds) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
  return context;
}

void CheckUnary(GRPCInferenceService::Stub& stub) {
  // identity_fp32: the values come back unchanged.
  std::vector<float> x(3 * 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * i - 3.0f;
  ModelInferResponse response;
  grpc::Status status = stub.ModelInfer(Context(10).get(), Fp32Request("identity_fp32", "INPUT0", {3, 5}, x), &response);
  CHECK(status.ok(), "identity_fp32 " + Describe(status));
  std::vector<int64_t> shape;
  CHECK(Fp32Output(response, "OUTPUT0", &shape) == x, "identity_fp32 values");
  CHECK((shape == std::vector<int64_t>{3, 5}), "identity_fp32 shape");

  // tiny: [2,64] -> [2,16]; each row equals that row sent alone.
  std::vector<float> rows(2 * 64);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = std::sin(static_cast<float>(i));
  status = stub.ModelInfer(Context(10).get(), Fp32Request("tiny", "INPUT", {2, 64}, rows), &response);
  CHECK(status.ok(), "tiny " + Describe(status));
  std::vector<float> batched = Fp32Output(response, "OUTPUT", &shape);
  CHECK((shape == std::vector<int64_t>{2, 16}) && batched.size() == 32, "tiny shape");
  for (int row = 0; row < 2; ++row) {
    std::vector<float> one(rows.begin() + row * 64, rows.begin() + (row + 1) * 64);
    ModelInferResponse alone;
    status = stub.ModelInfer(Context(10).get(), Fp32Request("tiny", "INPUT", {1, 64}, one), &alone);
    CHECK(status.ok(), "tiny alone " + Describe(status));
    std::vector<float> single = Fp32Output(alone, "OUTPUT", nullptr);
    for (int j = 0; j < 16; ++j) {
      CHECK(std::isfinite(single[j]) && std::fabs(single[j] - batched[row * 16 + j]) <= 1e-5f, "tiny row " + std::to_string(row));
    }
  }
}

void CheckStream(GRPCInferenceService::Stub& stub) {
  constexpr int kCount = 100;
  std::map<std::string, std::vector<float>> sent;
  std::vector<ModelInferRequest> requests;
  for (int i = 0; i < kCount; ++i) {
    std::vector<float> x(1 + i % 7);
    for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(i * 100 + j);
    std::string id = "req-" + std::to_string(i);
    requests.push_back(Fp32Request("identity_fp32", "INPUT0", {1, static_cast<int64_t>(x.size())}, x, id));
    sent[id] = x;
  }
  auto context = Context(60);
  auto stream = stub.ModelStreamInfer(context.get());
  // Writes and reads overlap: the server answers in completion order while we still send.
  std::thread writer([&] {
    for (const auto& request : requests) {
      if (!stream->Write(request)) break;
    }
    stream->WritesDone();
  });
  std::map<std::string, int> seen;
  std::string failure;
  ModelStreamInferResponse message;
  while (stream->Read(&message)) {
    const auto& response = message.infer_response();
    if (!message.error_message().empty()) {
      failure = response.id() + ": " + message.error_message();
      continue;
    }
    auto it = sent.find(response.id());
    if (it == sent.end()) {
      failure = "unexpected id " + response.id();
      continue;
    }
    if (Fp32Output(response, "OUTPUT0", nullptr) != it->second) failure = "wrong values for " + response.id();
    ++seen[response.id()];
  }
  writer.join();
  grpc::Status status = stream->Finish();
  CHECK(status.ok(), "stream " + Describe(status));
  CHECK(failure.empty(), failure);
  CHECK(seen.size() == kCount, std::to_string(seen.size()) + " of 100 ids answered");
  for (const auto& [id, count] : seen) CHECK(count == 1, id + " answered " + std::to_string(count) + " times");
}

void CheckDeadlines(GRPCInferenceService::Stub& stub) {
  std::vector<float> x(64, 1.0f);
  // The request's own deadline: `timeout` parameter of 1 µs, judged by the server's dispatcher.
  ModelInferRequest request = Fp32Request("tiny", "INPUT", {1, 64}, x);
  (*request.mutable_parameters())["timeout"].set_int64_param(1);
  ModelInferResponse response;
  grpc::Status status = stub.ModelInfer(Context(10).get(), request, &response);
  CHECK(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED, "timeout parameter: " + Describe(status));

  // A gRPC deadline that has already passed.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() - std::chrono::seconds(1));
  status = stub.ModelInfer(&context, Fp32Request("tiny", "INPUT", {1, 64}, x), &response);
  CHECK(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED, "expired gRPC deadline: " + Describe(status));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " HOST:PORT\n";
    return 2;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(argv[1], grpc::InsecureChannelCredentials(), args);
  auto stub = GRPCInferenceService::NewStub(channel);

  int failures = 0;
  const std::pair<const char*, void (*)(GRPCInferenceService::Stub&)> checks[] = {
      {"unary infer (identity_fp32, tiny)", CheckUnary},
      {"100-message stream, every id once", CheckStream},
      {"deadlines give DEADLINE_EXCEEDED", CheckDeadlines},
  };
  for (const auto& [name, check] : checks) {
    try {
      check(*stub);
      std::cout << "PASS " << name << std::endl;
    } catch (const std::exception& err) {
      std::cout << "FAIL " << name << ": " << err.what() << std::endl;
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
