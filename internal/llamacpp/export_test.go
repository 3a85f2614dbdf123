package llamacpp

// PromptTokensDecoded counts the prompt tokens the engine has decoded.
func (e *Engine) PromptTokensDecoded() int64 { return e.promptDecoded.Load() }
