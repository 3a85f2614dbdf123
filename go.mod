module github.com/apiary-llm/apiary

go 1.26.8

require (
	github.com/ollama/ollama v0.17.4
	github.com/spf13/cobra v1.10.1
)

require (
	github.com/NVIDIA/go-nvml v0.13.0-1 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/openai/openai-go v1.12.0 // indirect
	github.com/prometheus/client_golang v1.23.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/tidwall/gjson v1.14.4 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sync v0.17.0 // indirect
)
