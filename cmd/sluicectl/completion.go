package main

import (
	"errors"
	"fmt"
	"io"
	"sort"
)

func init() {
	register(command{
		name:    "completion",
		summary: "print a shell completion script: bash or zsh (source <(sluicectl completion bash))",
		run:     runCompletion,
	})
	register(command{
		name:   "__commands",
		hidden: true,
		run: func(_ []string, out, _ io.Writer) error {
			names := make([]string, 0, len(commands))
			for n, c := range commands {
				if !c.hidden {
					names = append(names, n)
				}
			}
			sort.Strings(names)
			for _, n := range names {
				fmt.Fprintf(out, "%s:%s\n", n, commands[n].summary)
			}
			return nil
		},
	})
}

// The scripts ask sluicectl itself: the commands from the hidden
// __commands, a command's flags from its -h usage. So they never go stale
// when a command or flag is added, at the cost of running sluicectl on a
// TAB, which is quick (it parses flags and exits).
const (
	bashCompletion = `# bash completion for sluicectl; load with: source <(sluicectl completion bash)
_sluicectl() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  if [[ $COMP_CWORD -eq 1 ]]; then
    COMPREPLY=($(compgen -W "$(sluicectl __commands 2>/dev/null | cut -d: -f1) --help --version" -- "$cur"))
    return
  fi
  case ${COMP_WORDS[1]} in
    completion) COMPREPLY=($(compgen -W "bash zsh" -- "$cur")); return ;;
    config) if [[ $COMP_CWORD -eq 2 ]]; then COMPREPLY=($(compgen -W "validate apply status" -- "$cur")); return; fi ;;
    credit) if [[ $COMP_CWORD -eq 2 ]]; then COMPREPLY=($(compgen -W "freeze thaw" -- "$cur")); return; fi ;;
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(sluicectl "${COMP_WORDS[1]}" -h 2>&1 | sed -n 's/^  -\([a-zA-Z0-9-]*\).*/--\1/p')" -- "$cur"))
    return
  fi
  case ${COMP_WORDS[COMP_CWORD-1]} in
    -o|--o) COMPREPLY=($(compgen -W "table json" -- "$cur")) ;;
    *) COMPREPLY=($(compgen -f -- "$cur")) ;;
  esac
}
complete -F _sluicectl sluicectl
`
	zshCompletion = `#compdef sluicectl
# zsh completion for sluicectl; load with: source <(sluicectl completion zsh)
# (or save it as _sluicectl in a directory of $fpath)
_sluicectl() {
  local -a cmds flags
  if (( CURRENT == 2 )); then
    cmds=(${(f)"$(sluicectl __commands 2>/dev/null)"})
    _describe -t commands 'sluicectl command' cmds
    return
  fi
  case $words[2] in
    completion) compadd bash zsh; return ;;
    config) if (( CURRENT == 3 )); then compadd validate apply status; return; fi ;;
    credit) if (( CURRENT == 3 )); then compadd freeze thaw; return; fi ;;
  esac
  if [[ $words[CURRENT] == -* ]]; then
    flags=(${(f)"$(sluicectl $words[2] -h 2>&1 | sed -n 's/^  -\([a-zA-Z0-9-]*\).*/--\1/p')"})
    compadd -a flags
    return
  fi
  if [[ $words[CURRENT-1] == (-o|--o) ]]; then
    compadd table json
    return
  fi
  _files
}
compdef _sluicectl sluicectl
`
)

// runCompletion prints the completion script of the shell named.
func runCompletion(args []string, out, _ io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: sluicectl completion bash|zsh")
	}
	switch args[0] {
	case "bash":
		_, err := io.WriteString(out, bashCompletion)
		return err
	case "zsh":
		_, err := io.WriteString(out, zshCompletion)
		return err
	}
	return fmt.Errorf("completion %q: want bash or zsh", args[0])
}
