package llamacpp

import (
	"sync/atomic"
	"time"
	"unsafe"
)

// PromptTokensDecoded counts the prompt tokens the engine has decoded.
func (e *Engine) PromptTokensDecoded() int64 { return e.promptDecoded.Load() }

// OnStep sets a function the decode loop calls before each step with
// its tokens of foreground and of background sequences; set it before
// the first request.
func (e *Engine) OnStep(f func(fg, bg int)) { e.onStep = f }

// SetForegroundRecent sets how long after a foreground sequence the
// background prompts still go in chunks; set it before the first request.
func (e *Engine) SetForegroundRecent(d time.Duration) { e.fgRecent = d }

// OnBackgroundStep sets a function the decode loop calls when it is about
// to decode a step of background tokens that a foreground request would
// end; set it before the first request.
func (e *Engine) OnBackgroundStep(f func()) { e.onBackgroundStep = f }

// StepsYielded counts the background steps ended, or not begun, for a
// foreground request.
func (e *Engine) StepsYielded() int64 { return e.stepsYielded.Load() }

// ForegroundComing counts the foreground requests on their way to the
// decode loop.
func (e *Engine) ForegroundComing() int32 { return e.fgComing.Load() }

// StepAbortAsked reports whether the step under way is asked to end.
func (e *Engine) StepAbortAsked() bool {
	return e.abortFlag != nil && atomic.LoadInt32((*int32)(unsafe.Pointer(e.abortFlag))) != 0
}
