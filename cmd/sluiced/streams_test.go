//go:build linux

package main

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// One connection that opens 50,000 calls and sends none of their request
// messages leaves sluiced's resident memory within 100 MB of where it
// started, while it holds them and after it closes: the calls past the
// per-connection bound (--max-concurrent-streams) are refused, not each
// given a goroutine. A separate process built as it is deployed.
func TestOneConnectionsStreamsResidentMemory(t *testing.T) {
	const (
		streams = 50_000
		within  = 100 << 20
	)
	bin := buildSluiced(t)
	cmd, grpcAddr := startSluiced(t, bin, []string{"--topology", "simulated", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json"})
	pid := cmd.Process.Pid
	start := settledResident(t, pid, 0)

	c, err := net.Dial("tcp", grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A guard against a server that stops answering, not a measure.
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	w := bufio.NewWriterSize(c, 64<<10)
	fr := http2.NewFramer(w, c)
	if _, err := w.WriteString(http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	// The server's frames are read as they come (RST_STREAMs for the
	// refused calls), so that its writes never block, until the PING
	// that follows the last HEADERS is answered: the server has read
	// them all.
	pinged := make(chan error, 1)
	go func() {
		rd := http2.NewFramer(nil, c)
		for {
			f, err := rd.ReadFrame()
			if err != nil {
				pinged <- err
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				pinged <- nil
				return
			}
		}
	}()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for i := range uint32(streams) {
		block.Reset()
		for _, f := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":path", admissionv1.Admission_Admit_FullMethodName},
			{":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"},
		} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2*i + 1, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fr.WritePing(false, [8]byte{'s', 't', 'r', 'e', 'a', 'm', 's'}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := <-pinged; err != nil {
		t.Fatalf("reading sluiced's frames: %v", err)
	}
	held := residentBytes(t, pid)
	peak := statusBytes(t, pid, "VmHWM")
	c.Close()
	after := settledResident(t, pid, start+within)
	t.Logf("one connection's %d calls: %.1f MB resident at start, %.1f MB holding them (peak %.1f MB), %.1f MB after it closed",
		streams, mb(start), mb(held), mb(peak), mb(after))
	if held > start+within || after > start+within {
		t.Errorf("one connection's %d calls: %.1f MB resident holding them, %.1f MB after, from %.1f MB at start; want within %d MB",
			streams, mb(held), mb(after), mb(start), within>>20)
	}
}

// mb is n bytes in MB, for the log.
func mb(n int64) float64 { return float64(n) / (1 << 20) }
