package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/apiary-llm/apiary/internal/termtext"
)

// The CLI prints what daemons tell it (names, reasons, messages, errors,
// worker logs): every such string reaches the terminal through table.row,
// printLine, printError or a textWriter, which show control characters and bidirectional overrides
// as visible escapes (termtext) instead of letting them act.

// table is the table of a list command: columns aligned with tabwriter,
// each cell one line of printable text.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	t.row(header...)
	return t
}

// row writes one row; a tab or newline inside a cell is escaped too, so no
// cell can shift the columns or forge a row.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(t.tw, "\t")
		}
		io.WriteString(t.tw, termtext.Line(c))
	}
	io.WriteString(t.tw, "\n")
}

func (t *table) flush() error { return t.tw.Flush() }

// printLine writes format and args as fmt.Fprintf does, plus a newline;
// every string, error or Stringer among args is shown as printable text.
func printLine(w io.Writer, format string, args ...any) error {
	for i, a := range args {
		switch v := a.(type) {
		case string:
			args[i] = termtext.Line(v)
		case error:
			args[i] = termtext.Line(v.Error())
		case fmt.Stringer:
			args[i] = termtext.Line(v.String())
		}
	}
	_, err := fmt.Fprintf(w, format+"\n", args...)
	return err
}

// printError writes err as "apiary: …" on w. An error's lines stay lines
// (errors.Join), every other control character is escaped.
func printError(w io.Writer, err error) {
	fmt.Fprintf(w, "apiary: %s\n", termtext.Text(err.Error()))
}

// textWriter passes a stream of text from elsewhere (a worker's log) to w
// as printable text: newlines stay, every other control character is
// escaped (termtext.Text). A UTF-8 sequence split between two writes is
// held back until it is whole (or Flush), so that it is not escaped as
// bytes.
type textWriter struct {
	w     io.Writer
	carry []byte // at most utf8.UTFMax-1 bytes: the start of a rune
}

func (t *textWriter) Write(p []byte) (int, error) {
	b := append(t.carry, p...)
	cut := len(b)
	for i := len(b) - 1; i >= 0 && i > len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				cut = i
			}
			break
		}
	}
	t.carry = append([]byte(nil), b[cut:]...)
	if _, err := io.WriteString(t.w, termtext.Text(string(b[:cut]))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what is held back.
func (t *textWriter) Flush() error {
	if len(t.carry) == 0 {
		return nil
	}
	_, err := io.WriteString(t.w, termtext.Text(string(t.carry)))
	t.carry = nil
	return err
}
