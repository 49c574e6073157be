// Command shapecheck holds the limits on berth's shape that make lint
// enforces on every non-test Go file of the repository, in all its
// modules (cmd/, internal/, hack/, the fixtures under test/, the
// benchmarks in bench/): no file over 800 lines, no function over 120
// (from its func keyword to its closing brace); and every directory of Go
// code named in docs/architecture.md, so that a package cannot appear
// without the map saying what it owns. Tests (_test.go) are measured
// (-top) but not held: a table of cases, or a scenario, may run long;
// nor is generated code ("Code generated ... DO NOT EDIT."), which no one
// edits by hand. skipDirs are not walked at all.
//
//	go run ./hack/shapecheck          # from the repository root
//	go run ./hack/shapecheck -top 10  # also print the ten longest functions, tests included
package main

import (
	"cmp"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

const (
	maxFileLines = 800
	maxFuncLines = 120
	archDoc      = "docs/architecture.md"
)

// skipDirs are never walked: data, build output and other checkouts.
var skipDirs = map[string]bool{"testdata": true, "vendor": true, "bin": true, "out": true, "node_modules": true}

type fn struct {
	pos   string // file:line
	name  string
	lines int
	test  bool
}

func main() {
	top := flag.Int("top", 0, "print the `n` longest functions")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	problems, fns, err := check(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shapecheck:", err)
		os.Exit(2)
	}
	if *top > 0 {
		slices.SortFunc(fns, func(a, b fn) int { return cmp.Compare(b.lines, a.lines) })
		for _, f := range fns[:min(*top, len(fns))] {
			fmt.Printf("%4d %s %s\n", f.lines, f.pos, f.name)
		}
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}

// check walks the Go files under root and returns what breaks the limits
// and every function it measured.
func check(root string) (problems []string, fns []fn, err error) {
	doc, err := os.ReadFile(filepath.Join(root, archDoc))
	if err != nil {
		return nil, nil, err
	}
	dirs := map[string]bool{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || skipDirs[d.Name()]) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		dirs[filepath.ToSlash(filepath.Dir(rel))] = true
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return err
		}
		test := strings.HasSuffix(path, "_test.go")
		held := !test && !ast.IsGenerated(f)
		if n := fset.File(f.Pos()).LineCount(); held && n > maxFileLines {
			problems = append(problems, fmt.Sprintf("%s: %d lines, over %d", rel, n, maxFileLines))
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			m := fn{pos: fmt.Sprintf("%s:%d", rel, start.Line), name: funcName(fd), lines: end.Line - start.Line + 1, test: test}
			fns = append(fns, m)
			if held && m.lines > maxFuncLines {
				problems = append(problems, fmt.Sprintf("%s: %s is %d lines, over %d", m.pos, m.name, m.lines, maxFuncLines))
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	for _, dir := range slices.Sorted(maps.Keys(dirs)) {
		if dir != "." && !named(string(doc), dir) {
			problems = append(problems, fmt.Sprintf("%s: a directory of Go code that %s does not name (as `%s`)", dir, archDoc, dir))
		}
	}
	return problems, fns, nil
}

// named reports whether doc names dir in backquotes, in full or, below a
// package of internal/, from that package on (`oci/ocicli`).
func named(doc, dir string) bool {
	if strings.Contains(doc, "`"+dir+"`") {
		return true
	}
	sub, ok := strings.CutPrefix(dir, "internal/")
	return ok && strings.Contains(sub, "/") && strings.Contains(doc, "`"+sub+"`")
}

// funcName is fd's name, with its receiver's type for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch r := t.(type) {
	case *ast.IndexExpr:
		t = r.X
	case *ast.IndexListExpr:
		t = r.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
