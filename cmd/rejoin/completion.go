package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

const completionUsage = `usage: rejoin completion bash|zsh

Prints a completion script for the shell: the commands, each command's
flags, and after a flag that takes a value, file names.

  source <(rejoin completion bash)        # bash, this shell; or in ~/.bashrc
  source <(rejoin completion zsh)         # zsh, after compinit; or in ~/.zshrc

The script is made from the commands' own flags, so it is as current as
the binary that prints it.
`

// The completion command reads commands, which therefore cannot hold it
// in its initializer (an initialization cycle): it joins the table here.
func init() {
	commands = append(commands, command{"completion", "print a shell completion script: rejoin completion bash|zsh", runCompletion})
}

func runCompletion(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("completion", stderr)
	fs.Usage = func() { fmt.Fprint(stderr, completionUsage) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	cmds := completionTable()
	switch fs.Arg(0) {
	case "bash":
		writeBashCompletion(stdout, cmds)
	case "zsh":
		writeZshCompletion(stdout, cmds)
	default:
		fmt.Fprintf(stderr, "rejoin completion: unknown shell %q: want bash or zsh\n", fs.Arg(0))
		return errUsage
	}
	return nil
}

// flagSets, given as a command's stderr, collects the flag sets the
// command makes (newFlagSet adds them) and drops what it prints: run with
// -h, a command shows its flags to completion without a list kept apart
// from the flags themselves.
type flagSets struct{ sets []*flag.FlagSet }

func (*flagSets) Write(p []byte) (int, error) { return len(p), nil }

// completionFlag is one flag as a completion script offers it.
type completionFlag struct {
	name  string
	usage string // one short line, free of zsh-spec metacharacters
	value bool   // takes a value
	file  bool   // the value is a file or a directory: file names complete
}

type completionCommand struct {
	name    string
	summary string
	flags   []completionFlag
	words   []string // what completes as an argument: help's commands, completion's shells
}

// completionTable is every command, help included, with its flags, in the
// order of usage.
func completionTable() []completionCommand {
	var out []completionCommand
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	names = append(names, "help")
	for _, c := range commands {
		cc := completionCommand{name: c.name, summary: completionText(c.summary)}
		fsets := &flagSets{}
		_ = c.run([]string{"-h"}, io.Discard, fsets)
		seen := map[string]bool{}
		for _, fs := range fsets.sets {
			fs.VisitAll(func(f *flag.Flag) {
				if seen[f.Name] {
					return
				}
				seen[f.Name] = true
				arg, usage := flag.UnquoteUsage(f)
				bf, isBool := f.Value.(interface{ IsBoolFlag() bool })
				cf := completionFlag{name: f.Name, usage: completionText(usage), value: !isBool || !bf.IsBoolFlag()}
				// The flags name their values in backquotes: `file`, `directory`.
				cf.file = cf.value && (strings.Contains(arg, "file") || strings.Contains(arg, "dir"))
				cc.flags = append(cc.flags, cf)
			})
		}
		slices.SortFunc(cc.flags, func(a, b completionFlag) int { return strings.Compare(a.name, b.name) })
		if c.name == "completion" {
			cc.words = []string{"bash", "zsh"}
		}
		out = append(out, cc)
	}
	return append(out, completionCommand{name: "help", summary: completionText(helpSummary), words: names})
}

// completionText is the first clause of s, at most 70 bytes, without
// the characters a zsh spec gives a meaning (brackets, colons) or that a
// zsh single-quoted string cannot hold but as '\” (zshQuote does that).
func completionText(s string) string {
	if i := strings.IndexAny(s, ";(\n"); i > 0 {
		s = s[:i]
	}
	s = strings.Map(func(r rune) rune {
		switch r {
		case ':':
			return ','
		case '[', ']', '\\', '`', '$', '"':
			return ' '
		}
		return r
	}, s)
	s = strings.TrimRight(strings.Join(strings.Fields(s), " "), " ,")
	if len(s) > 70 {
		s = s[:67]
		if i := strings.LastIndexByte(s, ' '); i > 40 {
			s = s[:i]
		}
		s += "..."
	}
	return s
}

func writeBashCompletion(w io.Writer, cmds []completionCommand) {
	var names []string
	for _, c := range cmds {
		names = append(names, c.name)
	}
	fmt.Fprintf(w, `# bash completion for rejoin, printed by 'rejoin completion bash'.
# Load it with: source <(rejoin completion bash)
_rejoin() {
    local cur prev words opts files vals
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    if [[ $COMP_CWORD -eq 1 ]]; then
        COMPREPLY=($(compgen -W "%s --help --version" -- "$cur"))
        return 0
    fi
    case "${COMP_WORDS[1]}" in
`, strings.Join(names, " "))
	for _, c := range cmds {
		var opts, files, vals []string
		for _, f := range c.flags {
			opts = append(opts, "--"+f.name)
			switch {
			case f.file:
				files = append(files, "--"+f.name, "-"+f.name)
			case f.value:
				vals = append(vals, "--"+f.name, "-"+f.name)
			}
		}
		fmt.Fprintf(w, "    %s)\n        opts=%q\n        files=%q\n        vals=%q\n        words=%q ;;\n", c.name,
			strings.Join(opts, " "), " "+strings.Join(files, " ")+" ", " "+strings.Join(vals, " ")+" ", strings.Join(c.words, " "))
	}
	fmt.Fprint(w, `    *)
        return 0 ;;
    esac
    # After a flag whose value is a file: no words, so the default (file
    # names) applies; after one whose value is not, nothing at all.
    # --flag=value is one word and needs neither.
    if [[ -n "$prev" && "$files" == *" $prev "* ]]; then
        COMPREPLY=()
        return 0
    fi
    if [[ -n "$prev" && "$vals" == *" $prev "* ]]; then
        compopt +o default 2>/dev/null
        COMPREPLY=()
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [[ -n "$words" ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    else
        COMPREPLY=()
    fi
    return 0
}
complete -o default -F _rejoin rejoin
`)
}

func writeZshCompletion(w io.Writer, cmds []completionCommand) {
	fmt.Fprint(w, `#compdef rejoin
# zsh completion for rejoin, printed by 'rejoin completion zsh'.
# Load it with: source <(rejoin completion zsh), after compinit.
_rejoin() {
    local -a cmds specs
    cmds=(
`)
	for _, c := range cmds {
		fmt.Fprintf(w, "        %s\n", zshQuote(c.name+":"+c.summary))
	}
	fmt.Fprint(w, `    )
    if (( CURRENT == 2 )); then
        _describe -t commands 'rejoin command' cmds
        return
    fi
    case $words[2] in
`)
	for _, c := range cmds {
		fmt.Fprintf(w, "    %s)\n        specs=(\n", c.name)
		for _, f := range c.flags {
			spec := "--" + f.name + "[" + f.usage + "]"
			switch {
			case f.file:
				spec += ":" + f.name + ":_files"
			case f.value:
				spec += ":" + f.name + ": "
			}
			fmt.Fprintf(w, "            %s\n", zshQuote(spec))
		}
		if len(c.words) > 0 {
			fmt.Fprintf(w, "            '1:argument:(%s)'\n", strings.Join(c.words, " "))
		} else {
			fmt.Fprint(w, "            '*:argument:_files'\n")
		}
		fmt.Fprint(w, "        ) ;;\n")
	}
	fmt.Fprint(w, `    *)
        return 1 ;;
    esac
    shift words
    (( CURRENT-- ))
    _arguments $specs
}
if [[ "$funcstack[1]" == _rejoin ]]; then
    _rejoin "$@"
else
    compdef _rejoin rejoin
fi
`)
}

// zshQuote is s in single quotes.
func zshQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
