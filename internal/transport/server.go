package transport

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Server is an HTTP server of a process that serves one listener for its
// life (a worker, an engine's front), on its own goroutine.
type Server struct {
	srv  *http.Server
	done chan struct{} // closed when Serve returned
	err  error         // Serve's error; read after done
}

// Serve starts serving h on ln, with the timeouts apiary's processes use
// (headers within 10 s, idle connections closed after a minute) and
// net/http's own errors logged at Warn.
func Serve(ln net.Listener, h http.Handler, log *slog.Logger) *Server {
	s := &Server{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		done: make(chan struct{}),
	}
	go func() { // ends when Stop shuts the server down
		defer close(s.done)
		s.err = s.srv.Serve(ln)
	}()
	return s
}

// Done is closed when the server stopped serving: after Stop, or when
// its listener failed; Err says why then.
func (s *Server) Done() <-chan struct{} { return s.done }

// Err is why Serve returned (http.ErrServerClosed after Stop); read it
// after Done is closed.
func (s *Server) Err() error { return s.err }

// Stop closes the listener and idle connections, gives active ones wait
// to finish, closes those still open then, and waits for Serve to return.
func (s *Server) Stop(log *slog.Logger, wait time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		log.Warn("http server did not stop in time; closing connections", "err", err)
		_ = s.srv.Close()
	}
	<-s.done
	if s.err != nil && !errors.Is(s.err, http.ErrServerClosed) {
		log.Error("http server failed", "err", s.err)
	}
}
