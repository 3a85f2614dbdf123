package transport

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// OpenStream sends req with hc and returns once the answer begins: hc's
// time limit bounds the wait for it, not the reading of the body (a log
// that is followed, a stream of tokens). Closing the body ends the
// request.
func OpenStream(hc *http.Client, req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	req = req.WithContext(ctx)
	stream := *hc
	stream.Timeout = 0
	var late *time.Timer
	if hc.Timeout > 0 {
		late = time.AfterFunc(hc.Timeout, cancel)
	}
	resp, err := stream.Do(req)
	if late != nil && !late.Stop() && err == nil {
		resp.Body.Close()
		err = fmt.Errorf("no answer within %s", hc.Timeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelBody ends its request's context when closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
