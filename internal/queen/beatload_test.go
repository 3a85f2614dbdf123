package queen

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// beatLoad is the load generator of BenchmarkHeartbeatLoad: simulated
// hives, each with its own keep-alive connection to the queen, beating
// as a hive does. It must cost as little as it can and measure the queen,
// not itself, since it shares the machine with it:
//
//   - each hive's two requests (full and unchanged) are encoded once, as
//     raw HTTP/1.1, and sent with one write;
//   - a few shards, each one goroutine locked to its own thread, multiplex
//     the connections with epoll, parse only the status line and
//     Content-Length of each answer, and allocate nothing while beating;
//   - a hive beats its interval after its previous answer (the hive's own
//     loop), the hives starting at random phases over one interval, so
//     that the beats are spread over the second as a fleet's are;
//   - a beat's latency is from its write to the last byte of its answer;
//     how late the shard wrote it after it was due is kept apart (lag), as
//     is the CPU of the shards' threads (from getrusage).
type beatLoad struct {
	shards []*beatShard
}

// With stream set, each simulated hive beats on its pool's heartbeat
// stream (POST /v2/pools/{id}/beats, opened once, chunked), as hives do;
// otherwise one POST /v2/pools/{id}/heartbeat a beat, as hives of a queen
// without streams do.

// simHive is one simulated hive.
type simHive struct {
	fd              int
	pool            string
	full, unchanged []byte // the two requests
	alt             []byte // another full one, when beats change: sent in turn with full
	due             time.Time
	sentAt          time.Time
	pending         bool
	in              []byte // the answer so far
	idx             int    // in its shard's heap
}

// beatShard multiplexes its hives' connections on one thread.
type beatShard struct {
	hives  []*simHive
	byFD   map[int]*simHive
	ep     int
	queue  dueQueue
	events []unix.EpollEvent
	stream bool
	lat    []time.Duration // beat latencies of the last run
	lag    []time.Duration // how late each beat was written
	cpu    time.Duration   // the thread's CPU over the last run
	err    error           // the first failure of the last run
	fails  int
}

// loadShards is how many threads the generator uses: one per vCPU of the
// machine the benchmark was written for.
const loadShards = 2

// newBeatLoad connects one hive per pool to addr (host:port), spread over
// the shards. full and unchanged give each pool's request bodies; alt,
// when not nil, a second full one that full beats take turns with.
func newBeatLoad(addr string, pools []string, full, alt func(i int) []byte, unchanged []byte, stream bool) (*beatLoad, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("queen address %q: %w", addr, err)
	}
	l := &beatLoad{}
	for range loadShards {
		ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("epoll: %w", err)
		}
		l.shards = append(l.shards, &beatShard{ep: ep, byFD: map[int]*simHive{}, events: make([]unix.EpollEvent, 256), stream: stream})
	}
	for i, pool := range pools {
		h := &simHive{fd: -1, pool: pool, full: beatRequest(addr, pool, full(i)), unchanged: beatRequest(addr, pool, unchanged),
			in: make([]byte, 0, 512)}
		if alt != nil {
			h.alt = beatRequest(addr, pool, alt(i))
		}
		if stream {
			h.full, h.unchanged = beatChunk(full(i)), beatChunk(unchanged)
			if alt != nil {
				h.alt = beatChunk(alt(i))
			}
		}
		s := l.shards[i%len(l.shards)]
		s.hives = append(s.hives, h)
		if err := s.connect(h, ap, addr); err != nil {
			l.close()
			return nil, err
		}
	}
	return l, nil
}

// beatRequest is a heartbeat as the hive's HTTP client sends it.
func beatRequest(host, pool string, body []byte) []byte {
	head := fmt.Sprintf("POST /v2/pools/%s/heartbeat HTTP/1.1\r\nHost: %s\r\nUser-Agent: Go-http-client/1.1\r\n"+
		"Content-Length: %d\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n", pool, host, len(body))
	return append([]byte(head), body...)
}

// beatChunk is one heartbeat on a stream: its line as one chunk, as the
// hive's HTTP client sends each write to the stream's body.
func beatChunk(body []byte) []byte {
	return append(fmt.Appendf(nil, "%x\r\n", len(body)+1), append(body, "\n\r\n"...)...)
}

// openStream opens h's heartbeat stream on its connection, still
// blocking, as the hive's client does, and waits for the answer's head.
func openStream(h *simHive, host string) error {
	head := fmt.Sprintf("POST /v2/pools/%s/beats HTTP/1.1\r\nHost: %s\r\nUser-Agent: Go-http-client/1.1\r\n"+
		"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nAccept-Encoding: gzip\r\n\r\n", h.pool, host)
	if _, err := unix.Write(h.fd, []byte(head)); err != nil {
		return fmt.Errorf("open the stream of %s: %w", h.pool, err)
	}
	buf := make([]byte, 0, 512)
	for {
		// The queen's "100 Continue" first, then the stream's head.
		if end := bytes.Index(buf, []byte("\r\n\r\n")); end >= 0 && bytes.HasPrefix(buf, []byte("HTTP/1.1 100 ")) {
			buf = buf[:copy(buf, buf[end+4:])]
			continue
		}
		if bytes.Contains(buf, []byte("\r\n\r\n")) {
			break
		}
		if len(buf) == cap(buf) {
			return fmt.Errorf("open the stream of %s: an answer head over 512 bytes: %q", h.pool, buf)
		}
		n, err := unix.Read(h.fd, buf[len(buf):cap(buf)])
		if err != nil || n == 0 {
			return fmt.Errorf("open the stream of %s: %v after %q", h.pool, err, buf)
		}
		buf = buf[:len(buf)+n]
	}
	if !bytes.HasPrefix(buf, []byte("HTTP/1.1 200 ")) || !bytes.HasSuffix(buf, []byte("\r\n\r\n")) {
		return fmt.Errorf("open the stream of %s: answered %q", h.pool, buf)
	}
	return nil
}

// connect opens h's connection (TCP_NODELAY, as Go's clients do), and its
// stream in stream mode, and adds it to the shard's epoll set,
// non-blocking.
func (s *beatShard) connect(h *simHive, ap netip.AddrPort, host string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	h.fd = fd
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		return fmt.Errorf("connect to %s: %w", ap, err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return fmt.Errorf("TCP_NODELAY: %w", err)
	}
	if s.stream {
		if err := openStream(h, host); err != nil {
			return err
		}
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		return fmt.Errorf("non-blocking: %w", err)
	}
	if err := unix.EpollCtl(s.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)}); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	s.byFD[fd] = h
	return nil
}

func (l *beatLoad) close() {
	for _, s := range l.shards {
		for _, h := range s.hives {
			if h.fd >= 0 {
				unix.Close(h.fd)
				h.fd = -1
			}
		}
		unix.Close(s.ep)
	}
}

// warm sends every hive's full heartbeat once (the first beat of a pool
// adopts its worker's row: a store write each), at most window of them
// in flight per shard, and waits for every answer.
func (l *beatLoad) warm(window int, limit time.Duration) error {
	errs := make(chan error, len(l.shards))
	for _, s := range l.shards {
		go func() { errs <- s.warm(window, limit) }()
	}
	var first error
	for range l.shards {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (s *beatShard) warm(window int, limit time.Duration) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	end := time.Now().Add(limit)
	next, inFlight, done := 0, 0, 0
	for done < len(s.hives) {
		for inFlight < window && next < len(s.hives) {
			h := s.hives[next]
			next++
			if err := s.send(h, h.full, time.Now()); err != nil {
				return err
			}
			inFlight++
		}
		if time.Now().After(end) {
			return fmt.Errorf("warm-up: %d of %d first heartbeats answered within %s", done, len(s.hives), limit)
		}
		err := s.poll(100, func(*simHive, []byte, time.Time) {
			inFlight--
			done++
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// beatResult is one run of the generator.
type beatResult struct {
	lat, lag []time.Duration
	cpu      time.Duration // the shards' threads
	wall     time.Duration
	fails    int
	err      error
}

// run beats for window: each hive its interval after its last answer,
// the first beats at random phases over one interval; unchanged beats or
// full ones.
func (l *beatLoad) run(window, interval time.Duration, unchanged bool) beatResult {
	start := time.Now()
	done := make(chan struct{}, len(l.shards))
	for _, s := range l.shards {
		go func() {
			s.run(start, start.Add(window), interval, unchanged)
			done <- struct{}{}
		}()
	}
	for range l.shards {
		<-done
	}
	res := beatResult{wall: time.Since(start)}
	for _, s := range l.shards {
		res.lat = append(res.lat, s.lat...)
		res.lag = append(res.lag, s.lag...)
		res.cpu += s.cpu
		res.fails += s.fails
		if res.err == nil {
			res.err = s.err
		}
	}
	return res
}

func (s *beatShard) run(start, end time.Time, interval time.Duration, unchanged bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	defer func() { s.cpu = threadCPU() - cpu0 }()
	perHive := int(end.Sub(start)/interval) + 2
	s.lat, s.lag = make([]time.Duration, 0, len(s.hives)*perHive), make([]time.Duration, 0, len(s.hives)*perHive)
	s.err, s.fails = nil, 0
	s.queue = s.queue[:0]
	for _, h := range s.hives {
		h.due = start.Add(time.Duration(rand.Int64N(int64(interval))))
		heap.Push(&s.queue, h)
	}
	answered := func(h *simHive, body []byte, at time.Time) {
		s.lat = append(s.lat, at.Sub(h.sentAt))
		if unchanged && bytes.Contains(body, []byte(`"full_wanted"`)) {
			s.fail(fmt.Errorf("heartbeat of %s: the queen wants the full one: %s", h.pool, body))
		}
		h.due = at.Add(interval)
		heap.Push(&s.queue, h)
	}
	for {
		now := time.Now()
		if !now.Before(end) {
			s.drain(end.Add(30*time.Second), answered)
			return
		}
		for len(s.queue) > 0 && !s.queue[0].due.After(now) {
			h := heap.Pop(&s.queue).(*simHive)
			req := h.full
			switch {
			case unchanged:
				req = h.unchanged
			case h.alt != nil: // every beat differs from the one before
				h.full, h.alt = h.alt, h.full
			}
			s.lag = append(s.lag, now.Sub(h.due))
			if err := s.send(h, req, now); err != nil {
				s.fail(err)
			}
		}
		wait := end.Sub(now)
		if len(s.queue) > 0 {
			wait = min(wait, s.queue[0].due.Sub(now))
		}
		// epoll_wait counts whole milliseconds: round up, so that a beat
		// is never written early.
		if err := s.poll(int((wait+time.Millisecond-1)/time.Millisecond), answered); err != nil {
			s.fail(err)
			return
		}
	}
}

// drain waits until deadline for the answers to the beats still in
// flight when the window ended: their latencies count (they are the
// slowest), and the next window starts with every connection idle.
func (s *beatShard) drain(deadline time.Time, answered func(h *simHive, body []byte, at time.Time)) {
	for {
		pending := 0
		for _, h := range s.hives {
			if h.pending {
				pending++
			}
		}
		if pending == 0 {
			return
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			s.fail(fmt.Errorf("%d heartbeats unanswered 30 s after the window", pending))
			return
		}
		if err := s.poll(int(min(wait, 100*time.Millisecond)/time.Millisecond)+1, answered); err != nil {
			s.fail(err)
			return
		}
	}
}

func (s *beatShard) fail(err error) {
	s.fails++
	if s.err == nil {
		s.err = err
	}
}

// send writes req on h's connection; on loopback a request of a few
// hundred bytes always fits the socket's buffer.
func (s *beatShard) send(h *simHive, req []byte, now time.Time) error {
	n, err := unix.Write(h.fd, req)
	if err != nil || n != len(req) {
		return fmt.Errorf("heartbeat of %s: wrote %d of %d bytes: %v", h.pool, n, len(req), err)
	}
	h.sentAt, h.pending, h.in = now, true, h.in[:0]
	return nil
}

// poll waits up to timeout ms for answers and calls done for each
// complete one, with its body.
func (s *beatShard) poll(timeout int, done func(h *simHive, body []byte, at time.Time)) error {
	n, err := unix.EpollWait(s.ep, s.events, timeout)
	if errors.Is(err, unix.EINTR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("epoll_wait: %w", err)
	}
	for _, ev := range s.events[:n] {
		h := s.byFD[int(ev.Fd)]
		for { // until the answer is whole (nearly always one read) or the socket is empty
			if len(h.in) == cap(h.in) {
				h.in = append(h.in, 0)[:len(h.in)]
			}
			m, err := unix.Read(h.fd, h.in[len(h.in):cap(h.in)])
			if errors.Is(err, unix.EAGAIN) {
				break
			}
			if err != nil || m == 0 {
				return fmt.Errorf("heartbeat of %s: the queen closed the connection (%v) after %q", h.pool, err, h.in)
			}
			h.in = h.in[:len(h.in)+m]
			if !h.pending {
				return fmt.Errorf("heartbeat of %s: bytes from the queen with no request: %q", h.pool, h.in)
			}
			parse := parseAnswer
			if s.stream {
				parse = parseChunk
			}
			body, complete, err := parse(h.in)
			if err != nil {
				return fmt.Errorf("heartbeat of %s: %w", h.pool, err)
			}
			if complete {
				h.pending = false
				done(h, body, time.Now())
				break
			}
		}
	}
	return nil
}

// parseAnswer reads an HTTP/1.1 answer with a Content-Length: its body,
// whether it is all there, and an error when the status is not 200 or the
// answer cannot be read this way.
func parseAnswer(b []byte) (body []byte, complete bool, err error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, false, nil
	}
	head := b[:end]
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 ")) || len(head) < 12 {
		return nil, false, fmt.Errorf("not an HTTP/1.1 answer: %q", head)
	}
	const key = "\r\nContent-Length: "
	i := bytes.Index(head, []byte(key))
	if i < 0 {
		return nil, false, fmt.Errorf("answer without Content-Length: %q", head)
	}
	line := head[i+len(key):]
	if j := bytes.IndexByte(line, '\r'); j >= 0 {
		line = line[:j]
	}
	n := 0
	for _, c := range line { // strconv.Atoi would want a string: an allocation a beat
		if c < '0' || c > '9' || n > 1<<20 {
			return nil, false, fmt.Errorf("Content-Length %q is not a length", line)
		}
		n = n*10 + int(c-'0')
	}
	if len(b) < end+4+n {
		return nil, false, nil
	}
	body = b[end+4 : end+4+n]
	if len(b) > end+4+n {
		return nil, false, fmt.Errorf("%d bytes after the answer", len(b)-(end+4+n))
	}
	if code := string(head[9:12]); code != "200" {
		return nil, false, fmt.Errorf("status %s: %s", head[9:], body)
	}
	return body, true, nil
}

// parseChunk reads one answer line of a heartbeat stream: one chunk of
// the chunked answer, as the queen flushes each line. A line that is an
// error (api.LineError) is an error.
func parseChunk(b []byte) (body []byte, complete bool, err error) {
	end := bytes.Index(b, []byte("\r\n"))
	if end < 0 {
		return nil, false, nil
	}
	n := 0
	for _, c := range b[:end] {
		var d int
		switch {
		case c >= '0' && c <= '9':
			d = int(c - '0')
		case c >= 'a' && c <= 'f':
			d = int(c-'a') + 10
		default:
			return nil, false, fmt.Errorf("chunk size %q is not hexadecimal", b[:end])
		}
		if n = n*16 + d; n > 1<<20 {
			return nil, false, fmt.Errorf("chunk size %q over 1 MiB", b[:end])
		}
	}
	if n == 0 {
		return nil, false, fmt.Errorf("the queen ended the stream")
	}
	if len(b) < end+2+n+2 {
		return nil, false, nil
	}
	body = b[end+2 : end+2+n]
	if len(b) > end+2+n+2 {
		return nil, false, fmt.Errorf("%d bytes after the answer", len(b)-(end+2+n+2))
	}
	if bytes.HasPrefix(body, []byte(`{"error":`)) || !bytes.HasSuffix(body, []byte("\n")) {
		return nil, false, fmt.Errorf("answer line %q", body)
	}
	return body, true, nil
}

// threadCPU is the user and system CPU of the calling thread so far.
func threadCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// dueQueue is a shard's hives by when each beats next.
type dueQueue []*simHive

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q dueQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i]; q[i].idx = i; q[j].idx = j }
func (q *dueQueue) Push(x any)        { h := x.(*simHive); h.idx = len(*q); *q = append(*q, h) }
func (q *dueQueue) Pop() any {
	old := *q
	h := old[len(old)-1]
	*q = old[:len(old)-1]
	return h
}
