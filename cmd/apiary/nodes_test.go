package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/apiary-llm/apiary/internal/api"
)

func TestNodesAndInferCommands(t *testing.T) {
	url := startTestQueen(t)
	q := "--queen=" + url
	for _, tc := range []struct {
		args   []string
		code   int
		stdout []string
		stderr []string
	}{
		{[]string{"nodes", "ls", q}, 0, nil, []string{"no node:", "apiary pools ls"}},
		{[]string{"nodes", "add", "gpu1", q}, 2, nil, []string{"--ssh USER@HOST[:PORT] is required"}},
		{[]string{"nodes", "add", "gpu1", "--ssh", "root@-oProxyCommand=x", q}, 1, nil, []string{"invalid ssh target"}},
		{[]string{"nodes", "add", "bad/name", "--ssh", "root@h", q}, 1, nil, []string{"node name"}},
		{[]string{"nodes", "add", "local", "--ssh", "root@h", q}, 1, nil, []string{"reserved"}},
		{[]string{"nodes", "add", "gpu1", "--ssh", "root@h", "--install-dir", "rel/dir", q}, 1, nil, []string{"install dir"}},
		{[]string{"nodes", "rm", "nosuch", q}, 1, nil, []string{"node_not_found"}},
		{[]string{"nodes", "rm", q}, 2, nil, []string{"accepts 1 arg"}},
		{[]string{"nodes", q}, 2, nil, []string{"missing command"}},
		{[]string{"infer", "--prompt", "x", q}, 2, nil, []string{"--model is required"}},
		{[]string{"infer", "--model", "tiny", q}, 2, nil, []string{"--prompt is required"}},
		{[]string{"infer", "--model", "tiny", "--prompt", "x", "--max-tokens", "-1", q}, 2, nil, []string{"--max-tokens must not be negative"}},
		{[]string{"infer", "--model", "tiny", "--prompt", "x", "--queen", "ftp://x"}, 2, nil, []string{"--queen", "scheme must be http or https"}},
		{[]string{"infer", "--model", "tiny", "--prompt", "x", "--node", "n1", "--queen", "http://127.0.0.1:1"}, 2, nil, []string{"--node n1: no queen answers", "give the node's --ssh USER@HOST[:PORT]"}},
		{[]string{"infer", "--model", "tiny", "--prompt", "x", "--ssh", "root@h", "--install-dir", "/opt/a", q}, 2, nil, []string{"--ssh is for a node: give --node NAME", "--install-dir is for a node"}},
		{[]string{"infer", "--model", "tiny", "--prompt", "x", "--node", "n1", "--ssh", "root@-oProxyCommand=x", q}, 2, nil, []string{"--ssh", "invalid ssh target"}},
		{[]string{"infer", "--model", "tiny", "--prompt", "x", "--node", "n1", "--ssh", "root@h", q}, 2, nil, []string{"a queen answers at", "drop --ssh"}},
		{[]string{"infer", "--model", "/m/tiny.gguf", "--prompt", "x", "--node", "n1", "--ssh", "root@h", "--queen", "http://127.0.0.1:1"}, 2, nil, []string{"is a path, but the prompt runs on node n1", "--model tiny"}},
	} {
		code, out, errOut := apiary(t, tc.args...)
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d; stderr %q", tc.args, code, tc.code, errOut)
		}
		for _, s := range tc.stdout {
			if !strings.Contains(out, s) {
				t.Errorf("%v: stdout %q lacks %q", tc.args, out, s)
			}
		}
		for _, s := range tc.stderr {
			if !strings.Contains(errOut, s) {
				t.Errorf("%v: stderr %q lacks %q", tc.args, errOut, s)
			}
		}
	}
	_, out, _ := apiary(t, "nodes", "ls", "--json", q)
	var nodes api.NodeList
	if err := json.Unmarshal([]byte(out), &nodes); err != nil || nodes.Nodes == nil || len(nodes.Nodes) != 0 {
		t.Errorf("nodes ls --json: %v %s", err, out)
	}
}
