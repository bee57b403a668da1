// loadgen: the bench's open-loop load generator. It sends pre-serialized requests, unchanged, on
// a given schedule and records when each call was sent and answered, and with which gRPC
// status. By default each message is a ModelInferRequest sent to
// /inference.GRPCInferenceService/ModelInfer; with -http PATH each message is an HTTP request
// body (KServe v2 JSON, Content-Type application/json) POSTed to http://ADDR+PATH instead. The
// Python bench (service/trtserve/harness/benchlib/goclient.py) writes its inputs and reads its
// records; built by clients/go/build.sh (`make loadgen`), offline, with Debian's grpc-go in
// GOPATH mode.
//
//	loadgen -addr 127.0.0.1:PORT [-http /v2/models/M/infer] -connections K -messages FILE -schedule FILE -out FILE
//
// Files (all little-endian):
//   - messages: per message, its length in bytes (uint64), then its bytes.
//   - schedule: per call, 24 bytes: arrival (float64, seconds from the start, non-decreasing),
//     message index (int64), deadline (int64, µs after the call is sent; 0 = none).
//   - out (written at the end): per call sent, in schedule order, 40 bytes: message index
//     (int64), scheduled, sent, done (float64, seconds from the start, monotonic clock),
//     gRPC status code (int64; 0 = OK).
//
// Once its K connections are up it prints "start S" on stdout, S being the start on the
// system's CLOCK_MONOTONIC in seconds, and calls at the scheduled times. Open loop: every
// call has its own goroutine, so a late or slow call never delays the next send; a sender
// that falls behind its schedule sends at once and its lag shows as sent - scheduled. A line
// "stop T" on stdin (T in seconds from the start) stops it sending the arrivals scheduled at
// or after T; it still waits for every call it sent. The goroutines run on one thread unless
// GOMAXPROCS is set. It talks to a loopback address only. Exit status: 0 done, records
// written; 2 bad arguments or files; 1 the server cannot be reached.
//
// gRPC: call k uses connection k mod K, each its own TCP connection; a call's deadline is its
// gRPC deadline.
//
// HTTP (-http): HTTP/1.1 carries one request at a time on a connection, so each call takes a
// free kept-alive connection, or opens one: K are opened before the start (K concurrent
// GET /v2/health/live, the KServe v2 liveness route), more as calls overlap, none capped and
// none closed for want of room in the idle pool. A call's deadline is sent as the header
// trtserve-timeout-us (µs) and enforced by the client 1 ms later (so that the server's own
// 504 can come first; giving up closes that connection, as HTTP/1.1 cannot cancel a request
// otherwise). The answer's body is read to its end and dropped. Recorded as gRPC codes: 200
// OK (0), 400 INVALID_ARGUMENT (3), 404 NOT_FOUND (5), 429 RESOURCE_EXHAUSTED (8), 503
// UNAVAILABLE (14), 504 or the client's deadline DEADLINE_EXCEEDED (4), a connection error
// UNAVAILABLE (14), any other status UNKNOWN (2).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	method        = "/inference.GRPCInferenceService/ModelInfer"
	maxMessage    = 1 << 30
	scheduleSize  = 24
	recordSize    = 40
	dialTimeout   = 30 * time.Second
	liveRoute     = "/v2/health/live"
	timeoutHeader = "trtserve-timeout-us"
	// serverFirst: an HTTP call's own deadline runs this much past the one it sends, so that
	// the server's 504 arrives before the client gives up.
	serverFirst = time.Millisecond
)

// rawCodec passes request bytes through unchanged and drops the answer: only its status is
// kept. Named "proto" so that the content-type stays application/grpc+proto, which the bytes are.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec sends []byte, got %T", v)
	}
	return b, nil
}

func (rawCodec) Unmarshal([]byte, interface{}) error { return nil }

func (rawCodec) Name() string { return "proto" }

// sender sends one call and tells its gRPC status code.
type sender interface {
	// send sends message (call k of the schedule) with a deadline (0 = none).
	send(k int, message []byte, deadline time.Duration) codes.Code
	close()
}

// grpcSender calls ModelInfer over K connections, call k on connection k mod K.
type grpcSender struct{ conns []*grpc.ClientConn }

func (g grpcSender) send(k int, message []byte, deadline time.Duration) codes.Code {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if deadline > 0 {
		ctx, cancel = context.WithTimeout(ctx, deadline)
	}
	defer cancel()
	return status.Code(g.conns[k%len(g.conns)].Invoke(ctx, method, message, &[]byte{}))
}

func (g grpcSender) close() {
	for _, c := range g.conns {
		c.Close()
	}
}

// httpSender POSTs each message as a JSON body to url over kept-alive HTTP/1.1 connections.
type httpSender struct {
	client *http.Client
	url    string
}

// httpCodes: the gRPC code each HTTP status is recorded as (any other: UNKNOWN).
var httpCodes = map[int]codes.Code{
	http.StatusOK: codes.OK, http.StatusBadRequest: codes.InvalidArgument, http.StatusNotFound: codes.NotFound,
	http.StatusTooManyRequests: codes.ResourceExhausted, http.StatusServiceUnavailable: codes.Unavailable,
	http.StatusGatewayTimeout: codes.DeadlineExceeded,
}

func (h httpSender) send(_ int, message []byte, deadline time.Duration) codes.Code {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if deadline > 0 {
		ctx, cancel = context.WithTimeout(ctx, deadline+serverFirst)
	}
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(message))
	if err != nil {
		return codes.Unknown
	}
	req.Header.Set("Content-Type", "application/json")
	if deadline > 0 {
		req.Header.Set(timeoutHeader, strconv.FormatInt(deadline.Microseconds(), 10))
	}
	resp, err := h.client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body) // read to the end: the connection is then kept for the next call
		resp.Body.Close()
	}
	var netErr net.Error // a *url.Error: Timeout() when the deadline cut the call short, in its dial too
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		return codes.DeadlineExceeded
	case err != nil:
		return codes.Unavailable
	}
	if code, ok := httpCodes[resp.StatusCode]; ok {
		return code
	}
	return codes.Unknown
}

func (h httpSender) close() { h.client.CloseIdleConnections() }

type call struct {
	at       float64
	message  int64
	deadline time.Duration
}

type record struct {
	message               int64
	scheduled, sent, done float64
	code                  int64
}

func fail(status int, format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "loadgen: "+format+"\n", args...)
	os.Exit(status)
}

func readMessages(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var messages [][]byte
	for len(data) > 0 {
		if len(data) < 8 {
			return nil, fmt.Errorf("%s: %d trailing bytes, not a length", path, len(data))
		}
		n := binary.LittleEndian.Uint64(data)
		if n > uint64(len(data)-8) {
			return nil, fmt.Errorf("%s: message %d claims %d bytes, %d left", path, len(messages), n, len(data)-8)
		}
		messages = append(messages, data[8:8+n])
		data = data[8+n:]
	}
	return messages, nil
}

func readSchedule(path string, messages int) ([]call, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(data)%scheduleSize != 0 {
		return nil, fmt.Errorf("%s: %d bytes, not a multiple of %d", path, len(data), scheduleSize)
	}
	calls := make([]call, len(data)/scheduleSize)
	for k := range calls {
		b := data[k*scheduleSize:]
		c := call{
			at:      math.Float64frombits(binary.LittleEndian.Uint64(b)),
			message: int64(binary.LittleEndian.Uint64(b[8:])),
		}
		us := int64(binary.LittleEndian.Uint64(b[16:]))
		switch {
		case math.IsNaN(c.at) || c.at < 0 || (k > 0 && c.at < calls[k-1].at):
			return nil, fmt.Errorf("%s: call %d arrives at %g s; arrivals must be >= 0 and non-decreasing", path, k, c.at)
		case c.message < 0 || c.message >= int64(messages):
			return nil, fmt.Errorf("%s: call %d sends message %d of %d", path, k, c.message, messages)
		case us < 0:
			return nil, fmt.Errorf("%s: call %d has a negative deadline (%d µs)", path, k, us)
		}
		c.deadline = time.Duration(us) * time.Microsecond
		calls[k] = c
	}
	return calls, nil
}

func writeRecords(path string, records []record) error {
	buf := make([]byte, recordSize*len(records))
	for k, r := range records {
		b := buf[k*recordSize:]
		binary.LittleEndian.PutUint64(b, uint64(r.message))
		binary.LittleEndian.PutUint64(b[8:], math.Float64bits(r.scheduled))
		binary.LittleEndian.PutUint64(b[16:], math.Float64bits(r.sent))
		binary.LittleEndian.PutUint64(b[24:], math.Float64bits(r.done))
		binary.LittleEndian.PutUint64(b[32:], uint64(r.code))
	}
	return os.WriteFile(path, buf, 0o644)
}

func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("address %q is not a loopback IP address (127.0.0.1): the load generator talks to this machine only", addr)
	}
	return nil
}

func dialGRPC(addr string, count int) (sender, error) {
	conns := make([]*grpc.ClientConn, 0, count)
	for i := 0; i < count; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		conn, err := grpc.DialContext(ctx, addr, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithDefaultCallOptions(
			grpc.ForceCodec(rawCodec{}), grpc.MaxCallSendMsgSize(maxMessage), grpc.MaxCallRecvMsgSize(maxMessage)))
		cancel()
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("connection %d to %s: %w", i, addr, err)
		}
		conns = append(conns, conn)
	}
	return grpcSender{conns}, nil
}

// dialHTTP gives the sender to http://addr+path, with count connections opened (count
// concurrent GETs of the liveness route, each answered) and room in its idle pool for as many
// as calls can hold open at once.
func dialHTTP(addr, path string, count, calls int) (sender, error) {
	transport := &http.Transport{ // no Proxy: a zero Transport reads no proxy from the environment
		DialContext:         (&net.Dialer{Timeout: dialTimeout}).DialContext,
		MaxIdleConnsPerHost: count + calls,
		DisableCompression:  true,
	}
	h := httpSender{client: &http.Client{Transport: transport}, url: "http://" + addr + path}
	errs := make(chan error, count)
	for i := 0; i < count; i++ {
		go func() {
			resp, err := h.client.Get("http://" + addr + liveRoute)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	var first error
	for i := 0; i < count; i++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		h.close()
		return nil, fmt.Errorf("HTTP connection to %s: %w", addr, first)
	}
	return h, nil
}

// watchStop reads one line "stop T" from stdin, stores T (seconds from the start) in stopAt
// and then closes stopped. End of input without it: no stop.
func watchStop(stopAt *uint64, stopped chan<- struct{}) {
	scanner := bufio.NewScanner(os.Stdin)
	if !scanner.Scan() {
		return
	}
	fields := strings.Fields(scanner.Text())
	if len(fields) != 2 || fields[0] != "stop" {
		fail(2, "stdin: expected 'stop SECONDS', got %q", scanner.Text())
	}
	t, err := strconv.ParseFloat(fields[1], 64)
	if err != nil {
		fail(2, "stdin: %v", err)
	}
	atomic.StoreUint64(stopAt, math.Float64bits(t))
	close(stopped)
}

func main() {
	addr := flag.String("addr", "", "server address, HOST:PORT on a loopback IP (127.0.0.1)")
	httpPath := flag.String("http", "", "send each message as a JSON body POSTed to this path over HTTP "+
		"(e.g. /v2/models/tiny/infer) instead of a gRPC ModelInfer")
	connections := flag.Int("connections", 1, "client connections (gRPC: call k uses connection k mod this; "+
		"HTTP: opened before the start, more as calls overlap)")
	messagesPath := flag.String("messages", "", "file of length-prefixed messages: ModelInferRequests (HTTP: bodies)")
	schedulePath := flag.String("schedule", "", "file of calls: arrival s, message index, deadline µs")
	outPath := flag.String("out", "", "file the records are written to at the end")
	flag.Parse()
	if os.Getenv("GOMAXPROCS") == "" {
		// One thread runs the goroutines: the generator shares a small machine with the server,
		// and a second one only adds hand-offs between threads (measured on 2 cores: 15-25 %
		// more CPU per call at 1.5k-4.5k calls/s). GOMAXPROCS in the environment overrides it.
		runtime.GOMAXPROCS(1)
	}
	if *addr == "" || *messagesPath == "" || *schedulePath == "" || *outPath == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if *connections < 1 {
		fail(2, "-connections must be at least 1, got %d", *connections)
	}
	if err := checkLoopback(*addr); err != nil {
		fail(2, "%v", err)
	}
	messages, err := readMessages(*messagesPath)
	if err != nil {
		fail(2, "%v", err)
	}
	calls, err := readSchedule(*schedulePath, len(messages))
	if err != nil {
		fail(2, "%v", err)
	}
	if *httpPath != "" && !strings.HasPrefix(*httpPath, "/") {
		fail(2, "-http must be a path starting with '/', got %q", *httpPath)
	}
	var to sender
	if *httpPath != "" {
		to, err = dialHTTP(*addr, *httpPath, *connections, len(calls))
	} else {
		to, err = dialGRPC(*addr, *connections)
	}
	if err != nil {
		fail(1, "%v", err)
	}

	stopAt := math.Float64bits(math.Inf(1))
	stopped := make(chan struct{})
	go watchStop(&stopAt, stopped)
	stopTime := func() float64 { return math.Float64frombits(atomic.LoadUint64(&stopAt)) }
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		fail(1, "clock_gettime: %v", err)
	}
	start := time.Now()
	since := func() float64 { return time.Since(start).Seconds() }
	fmt.Printf("start %.9f\n", float64(ts.Sec)+float64(ts.Nsec)*1e-9)

	records := make([]record, len(calls))
	var wg sync.WaitGroup
	sent := 0
	for k, c := range calls {
		if wait := time.Until(start.Add(time.Duration(c.at * float64(time.Second)))); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-stopped: // a stop wakes the sender: the calls at or after it are never sent
				if c.at < stopTime() {
					<-timer.C
				}
			}
			timer.Stop()
		}
		if c.at >= stopTime() {
			break
		}
		sent++
		wg.Add(1)
		go func(k int, c call) {
			defer wg.Done()
			r := record{message: c.message, scheduled: c.at, sent: since()}
			r.code = int64(to.send(k, messages[c.message], c.deadline))
			r.done = since()
			records[k] = r
		}(k, c)
	}
	wg.Wait()
	to.close()
	if err := writeRecords(*outPath, records[:sent]); err != nil {
		fail(2, "%v", err)
	}
}
