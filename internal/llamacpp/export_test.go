package llamacpp

import "time"

// PromptTokensDecoded counts the prompt tokens the engine has decoded.
func (e *Engine) PromptTokensDecoded() int64 { return e.promptDecoded.Load() }

// OnStep sets a function the decode loop calls before each step with
// its tokens of foreground and of background sequences; set it before
// the first request.
func (e *Engine) OnStep(f func(fg, bg int)) { e.onStep = f }

// SetForegroundRecent sets how long after a foreground sequence the
// background prompts still go in chunks; set it before the first request.
func (e *Engine) SetForegroundRecent(d time.Duration) { e.fgRecent = d }
