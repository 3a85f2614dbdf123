package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/apiary-llm/apiary/internal/batch"
	"github.com/apiary-llm/apiary/internal/keeper"
	"github.com/apiary-llm/apiary/internal/secret"
)

func newJobsCmd() *cobra.Command {
	a := &adminFlags{}
	cmd := groupCmd("jobs", "Submit and follow batches of requests (the OpenAI Batch API)",
		`Submit a JSONL file of requests as a batch (the OpenAI Batch API: one
{"custom_id","method":"POST","url","body"} a line), list and follow batches,
cancel one, and write its results. The queen runs a batch's requests on free
worker slots: interactive requests always go first. Uses $APIARY_API_TOKEN.`,
		newJobsSubmitCmd(a), newJobsLsCmd(a), newJobsShowCmd(a), newJobsCancelCmd(a), newJobsResultsCmd(a))
	a.register(cmd)
	return cmd
}

// jobs is the Batch API client with the API token of the environment.
func (a *adminFlags) jobs() *keeper.Jobs {
	return keeper.NewClient(a.queen, "", "").Jobs(os.Getenv(secret.APITokenEnv))
}

func newJobsSubmitCmd(a *adminFlags) *cobra.Command {
	var endpoint, model string
	cmd := &cobra.Command{
		Use:   "submit FILE.jsonl [--endpoint PATH] [--model M]",
		Short: "Upload a JSONL file of requests and start a batch over it",
		Long: `Upload a JSONL file of requests and start a batch over it; prints the
batch id. --endpoint is /v1/chat/completions, /v1/completions or /v1/embeddings (every line's
url must be it); without it, the first line's url; --model sets body.model on every line.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("jobs submit: %w", err)
			}
			if endpoint == "" {
				if endpoint = firstURL(data); endpoint == "" {
					return usagef("jobs submit: %s: its first line names no url; give --endpoint (/v1/chat/completions, /v1/completions or /v1/embeddings)", args[0])
				}
			}
			if model != "" {
				if data, err = setModel(data, model); err != nil {
					return fmt.Errorf("jobs submit: %s: %w", args[0], err)
				}
			}
			j := a.jobs()
			f, err := j.Upload(cmd.Context(), args[0], data)
			if err != nil {
				return fmt.Errorf("jobs submit: %s: %w", args[0], err)
			}
			b, err := j.Create(cmd.Context(), f.ID, endpoint)
			if err != nil {
				return fmt.Errorf("jobs submit: %w", err)
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), b)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "batch of %d requests submitted; follow it with: apiary jobs show %s\n", b.RequestCounts.Total, b.ID)
			fmt.Fprintln(cmd.OutOrStdout(), b.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&endpoint, "endpoint", "", "the batch's endpoint: /v1/chat/completions, /v1/completions or /v1/embeddings")
	cmd.Flags().StringVar(&model, "model", "", "set body.model of every request to this model")
	return cmd
}

// setModel sets body.model on every line of a batch input file; blank
// lines stay, a line that is not a request is an error naming it.
func setModel(data []byte, model string) ([]byte, error) {
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			out.WriteByte('\n')
			continue
		}
		var req map[string]json.RawMessage
		var body map[string]json.RawMessage
		if err := json.Unmarshal(line, &req); err != nil {
			return nil, fmt.Errorf("line %d: not a JSON object: %w", n, err)
		}
		if err := json.Unmarshal(req["body"], &body); err != nil || body == nil {
			return nil, fmt.Errorf("line %d: body is not a JSON object", n)
		}
		body["model"], _ = json.Marshal(model)
		req["body"], _ = json.Marshal(body)
		b, _ := json.Marshal(req)
		out.Write(b)
		out.WriteByte('\n')
	}
	return out.Bytes(), sc.Err()
}

func newJobsLsCmd(a *adminFlags) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List batches, newest first",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > 100 {
				return usagef("jobs ls: --limit must be from 1 to 100, got %d", limit)
			}
			bs, err := a.jobs().List(cmd.Context(), limit)
			if err != nil {
				return err
			}
			if a.asJSON {
				return printJSON(cmd.OutOrStdout(), bs)
			}
			t := newTable(cmd.OutOrStdout(), "ID", "STATUS", "ENDPOINT", "COMPLETED", "FAILED", "TOTAL", "CREATED")
			for _, b := range bs {
				t.row(b.ID, string(b.Status), b.Endpoint, strconv.Itoa(b.RequestCounts.Completed), strconv.Itoa(b.RequestCounts.Failed),
					strconv.Itoa(b.RequestCounts.Total), time.Unix(b.CreatedAt, 0).Format(time.RFC3339))
			}
			return t.flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 20, "at most this many batches")
	return cmd
}

func newJobsShowCmd(a *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show a batch and its progress",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := a.jobs().Get(cmd.Context(), args[0])
			return a.showBatch(cmd, b, err)
		},
	}
}

// showBatch prints the batch a command got (JSON with --json), or err.
func (a *adminFlags) showBatch(cmd *cobra.Command, b batch.BatchObject, err error) error {
	if err != nil {
		return err
	}
	if a.asJSON {
		return printJSON(cmd.OutOrStdout(), b)
	}
	printBatch(cmd.OutOrStdout(), b)
	return nil
}

// printBatch writes a batch as `apiary jobs show` shows it.
func printBatch(w io.Writer, b batch.BatchObject) {
	c := b.RequestCounts
	pct := 0
	if c.Total > 0 {
		pct = 100 * (c.Completed + c.Failed) / c.Total
	}
	fmt.Fprintf(w, "id:        %s\nstatus:    %s\nendpoint:  %s\nprogress:  %d%% (%d of %d ended: %d completed, %d failed; %d running, %d queued)\n",
		b.ID, b.Status, b.Endpoint, pct, c.Completed+c.Failed, c.Total, c.Completed, c.Failed, b.Running, b.Queued)
	fmt.Fprintf(w, "created:   %s\n", time.Unix(b.CreatedAt, 0).Format(time.RFC3339))
	if b.OutputFileID != nil {
		fmt.Fprintf(w, "output:    %s\n", *b.OutputFileID)
	}
	if b.ErrorFileID != nil {
		fmt.Fprintf(w, "errors:    %s\n", *b.ErrorFileID)
	}
	if b.Errors != nil {
		for _, e := range b.Errors.Data {
			fmt.Fprintf(w, "error:     %s\n", e.Message)
		}
	}
}

func newJobsCancelCmd(a *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a batch: its queued requests are cancelled, those running finish",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := a.jobs().Cancel(cmd.Context(), args[0])
			return a.showBatch(cmd, b, err)
		},
	}
}

func newJobsResultsCmd(a *adminFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "results ID",
		Short: "Write an ended batch's result lines (output, then errors) to stdout",
		Long: `Write an ended batch's result lines to stdout: its output file (the
requests that succeeded), then its error file (the others), one line a request
with its custom_id.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			j := a.jobs()
			b, err := j.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !b.Status.Terminal() {
				return fmt.Errorf("jobs results: batch %s is %s: its results are written when it ends (apiary jobs show %s)", b.ID, b.Status, b.ID)
			}
			for _, id := range []*string{b.OutputFileID, b.ErrorFileID} {
				if id != nil {
					if err := j.Content(cmd.Context(), *id, cmd.OutOrStdout()); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
}

// firstURL is the "url" of the first request line of a batch file ("":
// none, or not a JSON object).
func firstURL(data []byte) string {
	for line := range bytes.Lines(data) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var l struct {
			URL string `json:"url"`
		}
		if json.Unmarshal(line, &l) != nil {
			return ""
		}
		return l.URL
	}
	return ""
}
