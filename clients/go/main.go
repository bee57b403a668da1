// trtserve Go client example: stubs generated from protos/ at build time by build.sh
// (protoc + protoc-gen-go + protoc-gen-go-grpc from Debian), never committed.
//
//	go_example HOST:PORT
//
// Runs the same three checks as the Node.js and C++ clients and exits 1 if any fails:
// unary infer (identity_fp32 values, tiny shape and row-alone equality), a 100-message
// stream with every id answered once, and DEADLINE_EXCEEDED for a 1 µs `timeout`
// parameter and for an expired gRPC deadline. Tensors travel as raw little-endian bytes.
package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "trtserve.local/inference"
)

// fp32Request is a ModelInferRequest with one FP32 input as raw little-endian bytes.
func fp32Request(model, input string, shape []int64, values []float32, id string) *pb.ModelInferRequest {
	raw := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	return &pb.ModelInferRequest{
		ModelName:        model,
		Id:               id,
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: input, Datatype: "FP32", Shape: shape}},
		RawInputContents: [][]byte{raw},
	}
}

// fp32Output is the named FP32 output of a response and its shape.
func fp32Output(resp *pb.ModelInferResponse, name string) ([]float32, []int64, error) {
	for i, t := range resp.Outputs {
		if t.Name != name {
			continue
		}
		if t.Datatype != "FP32" {
			return nil, nil, fmt.Errorf("%s is %s, not FP32", name, t.Datatype)
		}
		raw := resp.RawOutputContents[i]
		values := make([]float32, len(raw)/4)
		for j := range values {
			values[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
		}
		return values, t.Shape, nil
	}
	return nil, nil, fmt.Errorf("no output %s", name)
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func withTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

func checkUnary(client pb.GRPCInferenceServiceClient) error {
	x := make([]float32, 15)
	for i := range x {
		x[i] = 0.5*float32(i) - 3
	}
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	resp, err := client.ModelInfer(ctx, fp32Request("identity_fp32", "INPUT0", []int64{3, 5}, x, ""))
	if err != nil {
		return fmt.Errorf("identity_fp32: %w", err)
	}
	got, shape, err := fp32Output(resp, "OUTPUT0")
	if err != nil || !equal(got, x) || !equal(shape, []int64{3, 5}) {
		return fmt.Errorf("identity_fp32: got %v %v (%v)", shape, got, err)
	}

	rows := make([]float32, 2*64)
	for i := range rows {
		rows[i] = float32(math.Sin(float64(i)))
	}
	resp, err = client.ModelInfer(ctx, fp32Request("tiny", "INPUT", []int64{2, 64}, rows, ""))
	if err != nil {
		return fmt.Errorf("tiny: %w", err)
	}
	batched, shape, err := fp32Output(resp, "OUTPUT")
	if err != nil || !equal(shape, []int64{2, 16}) {
		return fmt.Errorf("tiny: shape %v (%v)", shape, err)
	}
	for row := 0; row < 2; row++ {
		alone, err := client.ModelInfer(ctx, fp32Request("tiny", "INPUT", []int64{1, 64}, rows[row*64:(row+1)*64], ""))
		if err != nil {
			return fmt.Errorf("tiny alone: %w", err)
		}
		single, _, err := fp32Output(alone, "OUTPUT")
		if err != nil {
			return err
		}
		for j, v := range single {
			if math.IsNaN(float64(v)) || math.Abs(float64(v-batched[row*16+j])) > 1e-5 {
				return fmt.Errorf("tiny row %d col %d: %v alone, %v batched", row, j, v, batched[row*16+j])
			}
		}
	}
	return nil
}

func checkStream(client pb.GRPCInferenceServiceClient) error {
	const count = 100
	ctx, cancel := withTimeout(60 * time.Second)
	defer cancel()
	stream, err := client.ModelStreamInfer(ctx)
	if err != nil {
		return err
	}
	sent := map[string][]float32{}
	requests := make([]*pb.ModelInferRequest, 0, count)
	for i := 0; i < count; i++ {
		x := make([]float32, 1+i%7)
		for j := range x {
			x[j] = float32(i*100 + j)
		}
		id := fmt.Sprintf("req-%d", i)
		sent[id] = x
		requests = append(requests, fp32Request("identity_fp32", "INPUT0", []int64{1, int64(len(x))}, x, id))
	}
	writeErr := make(chan error, 1)
	go func() { // writes overlap reads: answers come in completion order
		for _, r := range requests {
			if err := stream.Send(r); err != nil {
				writeErr <- err
				return
			}
		}
		writeErr <- stream.CloseSend()
	}()
	seen := map[string]int{}
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("stream: %w", err)
		}
		resp := msg.InferResponse
		if msg.ErrorMessage != "" {
			return fmt.Errorf("%s: %s", resp.GetId(), msg.ErrorMessage)
		}
		want, ok := sent[resp.Id]
		if !ok {
			return fmt.Errorf("unexpected id %q", resp.Id)
		}
		got, _, err := fp32Output(resp, "OUTPUT0")
		if err != nil || !equal(got, want) {
			return fmt.Errorf("wrong values for %s: %v (%v)", resp.Id, got, err)
		}
		seen[resp.Id]++
	}
	if err := <-writeErr; err != nil {
		return err
	}
	if len(seen) != count {
		return fmt.Errorf("%d of %d ids answered", len(seen), count)
	}
	for id, n := range seen {
		if n != 1 {
			return fmt.Errorf("%s answered %d times", id, n)
		}
	}
	return nil
}

func checkDeadlines(client pb.GRPCInferenceServiceClient) error {
	x := make([]float32, 64)
	req := fp32Request("tiny", "INPUT", []int64{1, 64}, x, "")
	req.Parameters = map[string]*pb.InferParameter{
		"timeout": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: 1}},
	}
	ctx, cancel := withTimeout(10 * time.Second)
	defer cancel()
	if _, err := client.ModelInfer(ctx, req); status.Code(err) != codes.DeadlineExceeded {
		return fmt.Errorf("timeout parameter: got %v", err)
	}
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if _, err := client.ModelInfer(past, fp32Request("tiny", "INPUT", []int64{1, 64}, x, "")); status.Code(err) != codes.DeadlineExceeded {
		return fmt.Errorf("expired gRPC deadline: got %v", err)
	}
	return nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintf(os.Stderr, "usage: %s HOST:PORT\n", os.Args[0])
		os.Exit(2)
	}
	conn, err := grpc.Dial(os.Args[1], grpc.WithInsecure(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer conn.Close()
	client := pb.NewGRPCInferenceServiceClient(conn)
	failures := 0
	for _, check := range []struct {
		name string
		run  func(pb.GRPCInferenceServiceClient) error
	}{
		{"unary infer (identity_fp32, tiny)", checkUnary},
		{"100-message stream, every id once", checkStream},
		{"deadlines give DEADLINE_EXCEEDED", checkDeadlines},
	} {
		if err := check.run(client); err != nil {
			fmt.Printf("FAIL %s: %v\n", check.name, err)
			failures++
		} else {
			fmt.Printf("PASS %s\n", check.name)
		}
	}
	if failures > 0 {
		os.Exit(1)
	}
}
