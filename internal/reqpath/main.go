// Command reqpath follows a request through the module's code and counts
// how often it comes back to a file it already left: the measure of
// whether each stage of the request path stays in one file.
//
//	go run ./internal/reqpath [-v] [-from pkg.Type.Method] [packages]
//
// From the entry (default: the Caddy module's ServeHTTP) it walks the
// static calls into the listed packages (default ./caddymodule ./resume)
// depth first, in source order, each function once; closures are walked
// where they are written, and a response writer the code builds (a
// composite literal of a type with WriteHeader) counts its WriteHeader,
// Write and FlushError as called there, since the upstream writes into it.
// It reports two counts: in the order functions are first entered (a
// return: a function in another file than the one before, in a file the
// path had already left), and in execution order, where coming back from
// a callee in another file to call something else is a move too (a stop:
// a stay in one file; a return: a stop in a file the trace already left).
// Coming back only to return is no stop.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

type listed struct {
	ImportPath string
	Dir        string
	Export     string
	GoFiles    []string
}

type fn struct {
	key  string
	file string
	decl *ast.FuncDecl
	info *types.Info
}

func main() {
	verbose := flag.Bool("v", false, "print every stop")
	from := flag.String("from", "caddymodule.Handler.ServeHTTP", "entry: package name, receiver type and method")
	flag.Parse()
	pkgs := flag.Args()
	if len(pkgs) == 0 {
		pkgs = []string{"./caddymodule", "./resume"}
	}
	exports := map[string]string{}
	out, err := exec.Command("go", append([]string{"list", "-export", "-deps", "-json"}, pkgs...)...).Output()
	check(err)
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var mine []listed
	want := map[string]bool{}
	lo, err := exec.Command("go", append([]string{"list"}, pkgs...)...).Output()
	check(err)
	for _, p := range strings.Fields(string(lo)) {
		want[p] = true
	}
	for {
		var l listed
		if err := dec.Decode(&l); err == io.EOF {
			break
		} else {
			check(err)
		}
		exports[l.ImportPath] = l.Export
		if want[l.ImportPath] {
			mine = append(mine, l)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	})
	funcs := map[string]*fn{}
	for _, l := range mine {
		var files []*ast.File
		for _, f := range l.GoFiles {
			af, err := parser.ParseFile(fset, filepath.Join(l.Dir, f), nil, 0)
			check(err)
			files = append(files, af)
		}
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{},
			Types: map[ast.Expr]types.TypeAndValue{}}
		conf := types.Config{Importer: imp}
		_, err := conf.Check(l.ImportPath, fset, files, info)
		check(err)
		for _, f := range files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				key := l.ImportPath + "." + fd.Name.Name
				if fd.Recv != nil {
					key = l.ImportPath + "." + recvName(fd.Recv.List[0].Type) + "." + fd.Name.Name
				}
				file := filepath.Join(filepath.Base(l.Dir), filepath.Base(fset.Position(fd.Pos()).Filename))
				funcs[key] = &fn{key: key, file: file, decl: fd, info: info}
			}
		}
	}
	var entry *fn
	for k, f := range funcs {
		if strings.HasSuffix(k, "/"+*from) {
			entry = f
		}
	}
	if entry == nil {
		check(fmt.Errorf("entry %s not found", *from))
	}
	seen := map[string]bool{}
	var path []*fn
	var trace []string // the files in execution order: into each callee and back
	var why []string   // the function each stop of trace begins in
	var visit func(f *fn)
	visit = func(f *fn) {
		if seen[f.key] {
			return
		}
		seen[f.key] = true
		path = append(path, f)
		enter := func(file string) {
			if len(trace) == 0 || trace[len(trace)-1] != file {
				trace = append(trace, file)
				why = append(why, f.key[strings.LastIndex(f.key, "/")+1:])
			}
		}
		enter(f.file)
		call := func(g *fn) {
			if !seen[g.key] {
				enter(f.file) // back in the caller, if a callee took the trace elsewhere
				visit(g)
			}
		}
		var inspect func(n ast.Node) bool
		inspect = func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				// Operands run before the call.
				switch fun := ast.Unparen(n.Fun).(type) {
				case *ast.SelectorExpr:
					ast.Inspect(fun.X, inspect)
				case *ast.FuncLit: // go func() { ... }(): walked where it is written
					ast.Inspect(fun.Body, inspect)
				}
				for _, a := range n.Args {
					ast.Inspect(a, inspect)
				}
				if g := callee(n, f.info, funcs); g != nil {
					call(g)
				}
				return false
			case *ast.CompositeLit:
				if t := f.info.Types[n].Type; t != nil {
					if named, ok := types.Unalias(t).(*types.Named); ok && named.Obj().Pkg() != nil {
						for _, m := range []string{"WriteHeader", "Write", "FlushError"} {
							if g := funcs[named.Obj().Pkg().Path()+"."+named.Obj().Name()+"."+m]; g != nil {
								call(g)
							}
						}
					}
				}
			}
			return true
		}
		ast.Inspect(f.decl.Body, inspect)
	}
	visit(entry)
	files := map[string]bool{}
	returns := 0
	for i, f := range path {
		back := i > 0 && f.file != path[i-1].file && files[f.file]
		if back {
			returns++
		}
		files[f.file] = true
	}
	fmt.Printf("%d functions in %d files; first-visit order: %d returns to a file already left\n", len(path), len(files), returns)
	// The trace as the request runs: a stop is a stay in one file (into a
	// callee and back to the caller are two moves), a return a stop in a
	// file the trace already left.
	been := map[string]bool{}
	back := 0
	for i, file := range trace {
		mark := "  "
		if been[file] {
			back++
			mark = "<-"
		}
		been[file] = true
		if *verbose {
			fmt.Printf("%3d %s %-28s %s\n", i+1, mark, file, why[i])
		}
	}
	fmt.Printf("execution order: %d stops in %d files, %d returns to a file already left\n", len(trace), len(been), back)

}

// callee is the module function a call calls, if it resolves statically.
func callee(call *ast.CallExpr, info *types.Info, funcs map[string]*fn) *fn {
	var obj types.Object
	switch e := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		obj = info.Uses[e]
	case *ast.SelectorExpr:
		if sel, ok := info.Selections[e]; ok {
			obj = sel.Obj()
		} else {
			obj = info.Uses[e.Sel]
		}
	}
	f, ok := obj.(*types.Func)
	if !ok || f.Pkg() == nil {
		return nil
	}
	key := f.Pkg().Path() + "." + f.Name()
	if sig, ok := f.Type().(*types.Signature); ok && sig.Recv() != nil {
		t := sig.Recv().Type()
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		named, ok := types.Unalias(t).(*types.Named)
		if !ok {
			return nil // an interface method: dynamic
		}
		if _, isIface := named.Underlying().(*types.Interface); isIface {
			return nil
		}
		key = f.Pkg().Path() + "." + named.Obj().Name() + "." + f.Name()
	}
	return funcs[key]
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return recvName(t.X)
	}
	return "?"
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "reqpath:", err)
		os.Exit(1)
	}
}
