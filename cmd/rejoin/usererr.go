package main

import (
	"flag"
	"reflect"
	"regexp"
	"strings"

	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// quietClasses are the packages' error classes that a command's message
// leaves out: each only says which package refused ("layout: bad config:
// supervise: placement:"), and what follows it already says what was
// wrong. Classes that tell the user something (an uncertain outcome, no
// reachable node) stay.
var quietClasses = []error{
	layout.ErrConfig,
	supervise.ErrPlacement,
	supervise.ErrConfig,
	supervise.ErrMove,
	supervise.ErrBadName,
	node.ErrConfig,
	certs.ErrIdentity,
	recovery.ErrConfig,
	cow.ErrConfig,
}

// userMessage is err's message as command name says it: without the
// quiet classes, without the command's own name repeated (demo's and
// chaos's configs say "demo: --nodes 70, ..."), and with the names of the
// config fields that flags set replaced by the flags (fields, from
// flagFields), as a library names its config's fields ("Rows 0, want >=
// 1") where the user typed --rows 0.
func userMessage(name string, err error, fields map[string]string) string {
	msg := err.Error()
	for _, c := range quietClasses {
		msg = strings.ReplaceAll(msg, c.Error()+": ", "")
	}
	msg = strings.TrimPrefix(msg, name+": ")
	if len(fields) == 0 {
		return msg
	}
	names := make([]string, 0, len(fields))
	for f := range fields {
		names = append(names, regexp.QuoteMeta(f))
	}
	re := regexp.MustCompile(`\b(` + strings.Join(names, "|") + `)\b`)
	return re.ReplaceAllStringFunc(msg, func(f string) string { return fields[f] })
}

// flagFields maps the names of the fields of the struct cfg points to
// that fs's flags set (fs.IntVar(&cfg.Rows, "rows", ...)) to those flags,
// "Rows" to "--rows": found by the address each flag writes to, so no
// list is kept beside the flag definitions.
func flagFields(fs *flag.FlagSet, cfg any) map[string]string {
	v := reflect.ValueOf(cfg).Elem()
	byAddr := map[uintptr]string{}
	for i := range v.NumField() {
		if v.Type().Field(i).Type.Size() > 0 {
			byAddr[v.Field(i).Addr().Pointer()] = v.Type().Field(i).Name
		}
	}
	out := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if rv := reflect.ValueOf(f.Value); rv.Kind() == reflect.Pointer {
			if name, ok := byAddr[rv.Pointer()]; ok {
				out[name] = "--" + f.Name
			}
		}
	})
	return out
}
