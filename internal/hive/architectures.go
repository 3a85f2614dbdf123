package hive

// textArchitectures are the general.architecture values of GGUF models the
// worker's llama.cpp can generate text with (llama.cpp's architecture names
// minus encoders, embedding-only models, vision towers and vocoders).
var textArchitectures = map[string]bool{}

func init() {
	for _, a := range []string{
		"llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan",
		"starcoder", "refact", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3",
		"qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "phi2", "phi3", "phimoe", "plamo", "plamo2",
		"codeshell", "orion", "internlm2", "minicpm", "minicpm3", "gemma", "gemma2", "gemma3", "gemma3n",
		"starcoder2", "mamba", "mamba2", "jamba", "falcon-h1", "xverse", "command-r", "cohere2", "dbrx",
		"olmo", "olmo2", "olmoe", "openelm", "arctic", "deepseek", "deepseek2", "chatglm", "glm4",
		"glm4moe", "bitnet", "t5", "jais", "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4",
		"rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe", "granitehybrid", "chameleon",
		"plm", "bailingmoe", "bailingmoe2", "dots1", "arcee", "afmoe", "ernie4_5", "ernie4_5-moe",
		"hunyuan-moe", "hunyuan-dense", "smollm3", "gpt-oss", "lfm2", "lfm2moe", "dream", "smallthinker",
		"llada", "llada-moe", "seed_oss", "grovemoe", "apertus", "minimax-m2", "cogvlm", "rnd1",
		"pangu-embedded", "mistral3",
		// New in llama.cpp v0.5.0 (de3ff815, 2026-09-28).
		"bailingmoe3", "cohere2moe", "deepseek32", "deepseek4", "exaone-moe", "gemma4", "glm-dsa", "granite_swa",
		"graniteswitch", "hy_v3", "hy_v4", "hunyuan_vl", "jais2", "kimi-k3", "kimi-linear", "laguna", "maincoder",
		"mellum", "mimo2", "minimax-01", "minimax-m3", "mistral4", "nanbeige", "plamo3", "qwen35", "qwen35moe",
		"qwen4exp", "step35", "hrm_text",
	} {
		textArchitectures[a] = true
	}
}
