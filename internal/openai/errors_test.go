package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestWriteError(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantBody   ErrorResponse
		wantRetry  string
	}{
		{
			name:       "invalid value names the param",
			err:        fmt.Errorf("decode: %w", Invalid("temperature", "temperature must be in [0, 2], got 3")),
			wantStatus: http.StatusBadRequest,
			wantBody: ErrorResponse{Error: ErrorObject{Code: CodeInvalidValue, Type: TypeInvalidRequest,
				Message: "temperature must be in [0, 2], got 3", Param: ptr("temperature")}},
		},
		{
			name:       "queue full carries Retry-After rounded up",
			err:        &Error{Status: http.StatusServiceUnavailable, Code: "queue_full", Message: "busy", RetryAfter: 1500 * time.Millisecond},
			wantStatus: http.StatusServiceUnavailable,
			wantBody:   ErrorResponse{Error: ErrorObject{Code: "queue_full", Type: TypeServer, Message: "busy"}},
			wantRetry:  "2",
		},
		{
			name:       "unauthorized type",
			err:        &Error{Status: http.StatusUnauthorized, Code: CodeUnauthorized, Message: "no"},
			wantStatus: http.StatusUnauthorized,
			wantBody:   ErrorResponse{Error: ErrorObject{Code: CodeUnauthorized, Type: TypeAuthentication, Message: "no"}},
		},
		{
			name:       "body too large",
			err:        fmt.Errorf("read: %w", &http.MaxBytesError{Limit: 10}),
			wantStatus: http.StatusRequestEntityTooLarge,
			wantBody: ErrorResponse{Error: ErrorObject{Code: CodeBodyTooLarge, Type: TypeInvalidRequest,
				Message: "request body is larger than the limit of 10 bytes"}},
		},
		{
			name:       "any other error is an opaque 500",
			err:        errors.New("secret: database password wrong"),
			wantStatus: http.StatusInternalServerError,
			wantBody:   ErrorResponse{Error: ErrorObject{Code: CodeInternal, Type: TypeServer, Message: "internal server error"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			if got := WriteError(rec, tt.err); got != tt.wantStatus {
				t.Errorf("WriteError returned %d, want %d", got, tt.wantStatus)
			}
			if rec.Code != tt.wantStatus {
				t.Errorf("status %d, want %d", rec.Code, tt.wantStatus)
			}
			if got := rec.Header().Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type %q", got)
			}
			if got := rec.Header().Get("Retry-After"); got != tt.wantRetry {
				t.Errorf("Retry-After %q, want %q", got, tt.wantRetry)
			}
			var body ErrorResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if diff := cmp.Diff(tt.wantBody, body); diff != "" {
				t.Errorf("body mismatch (-want +got):\n%s", diff)
			}
			if !strings.Contains(rec.Body.String(), `"param":`) {
				t.Errorf("body %s has no param key (OpenAI clients read it)", rec.Body)
			}
		})
	}
}

func TestReadBodyLimit(t *testing.T) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(strings.Repeat("x", 11)))
	_, err := ReadBody(rec, req, 10)
	if !errors.Is(err, ErrBodyTooLarge) {
		t.Fatalf("ReadBody of 11 bytes with limit 10: %v, want ErrBodyTooLarge", err)
	}
	if got := AsError(err).Status; got != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", got)
	}

	req = httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader("0123456789"))
	body, err := ReadBody(rec, req, 10)
	if err != nil || string(body) != "0123456789" {
		t.Errorf("ReadBody at the limit = %q, %v", body, err)
	}
}

func TestNewIDs(t *testing.T) {
	a, b := NewCompletionID(), NewCompletionID()
	if !strings.HasPrefix(a, "cmpl-") || a == b {
		t.Errorf("completion ids %q, %q", a, b)
	}
	if c := NewChatCompletionID(); !strings.HasPrefix(c, "chatcmpl-") {
		t.Errorf("chat id %q", c)
	}
}

// A Coded error is answered with its status, code, Retry-After, param and
// type however deeply it is wrapped, and with the outermost message.
func TestAsErrorFindsCodedErrorsThroughWrapping(t *testing.T) {
	sentinel := &CodedError{Status: http.StatusTooManyRequests, Code: "queue_full", Message: "queue full", Retry: 2 * time.Second}
	err := fmt.Errorf("model tiny: %w", fmt.Errorf("%w: 256 requests wait", sentinel))
	e := AsError(err)
	if e.Status != http.StatusTooManyRequests || e.Code != "queue_full" || e.RetryAfter != 2*time.Second ||
		e.Message != "model tiny: queue full: 256 requests wait" || !errors.Is(e, sentinel) {
		t.Errorf("AsError = %+v", e)
	}
	if e := AsError(fmt.Errorf("reading: %w", context.DeadlineExceeded)); e.Status != http.StatusGatewayTimeout || e.Code != "timeout" {
		t.Errorf("a deadline = %+v", e)
	}
	if e := AsError(errors.New("disk on fire")); e.Status != http.StatusInternalServerError || e.Message == "disk on fire" {
		t.Errorf("an uncoded error = %+v: its text must not reach the client", e)
	}
}
