package procs

import (
	"io"
	"strings"
	"testing"
)

func TestPreambleRoundTripStopsAtEmptyLine(t *testing.T) {
	var b strings.Builder
	if err := WritePreamble(&b, []string{"APIARY_CLUSTER_TOKEN=s3cr=t"}); err != nil {
		t.Fatal(err)
	}
	r := strings.NewReader(b.String() + "rest of the lifeline")
	env, err := ReadPreamble(r, []string{"APIARY_CLUSTER_TOKEN"})
	if err != nil {
		t.Fatal(err)
	}
	if env["APIARY_CLUSTER_TOKEN"] != "s3cr=t" || len(env) != 1 {
		t.Errorf("env %v", env)
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "rest of the lifeline" {
		t.Errorf("the preamble reader consumed past its end: left %q", rest)
	}
}

func TestPreambleRefusals(t *testing.T) {
	for name, in := range map[string]string{
		"unknown key":        "PATH=/tmp\n\n",
		"not KEY=VALUE":      "garbage\n\n",
		"parent gone before": "APIARY_CLUSTER_TOKEN=x\n",
		"nothing at all":     "",
	} {
		if _, err := ReadPreamble(strings.NewReader(in), []string{"APIARY_CLUSTER_TOKEN"}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := WritePreamble(io.Discard, []string{"A=b\nC=d"}); err == nil {
		t.Error("a two-line entry was written")
	}
}
