package tests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// Every test of this package chooses its group, parallel or serial, with
// its first statement (harness_test.go): a test that says nothing would
// run serially, alone, which is safe but lengthens every `make test` by
// its whole run, unnoticed.
func TestEveryTestChoosesItsGroup(t *testing.T) {
	parallel(t)
	files, err := filepath.Glob("*_test.go")
	must(t, err)
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		must(t, err)
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			checked++
			if group := firstCall(fn); group == "" {
				t.Errorf("%s: %s does not choose its group: make its first statement parallel(t), parallelLong(t, why), serial(t, why) or serialQuiet(t, why) (harness_test.go)",
					fset.Position(fn.Pos()), fn.Name.Name)
			}
		}
	}
	if checked < 100 {
		t.Fatalf("checked %d tests; the package has more than a hundred: the parse missed files", checked)
	}
}

// firstCall returns the name of the function fn's first statement calls
// with fn's *testing.T as its first argument, or "".
func firstCall(fn *ast.FuncDecl) string {
	if fn.Body == nil || len(fn.Body.List) == 0 || len(fn.Type.Params.List) != 1 || len(fn.Type.Params.List[0].Names) != 1 {
		return ""
	}
	stmt, ok := fn.Body.List[0].(*ast.ExprStmt)
	if !ok {
		return ""
	}
	call, ok := stmt.X.(*ast.CallExpr)
	if !ok || len(call.Args) == 0 {
		return ""
	}
	name, ok := call.Fun.(*ast.Ident)
	arg, ok2 := call.Args[0].(*ast.Ident)
	if !ok || !ok2 || arg.Name != fn.Type.Params.List[0].Names[0].Name {
		return ""
	}
	switch {
	case name.Name == "parallel" && len(call.Args) == 1:
		return name.Name
	case (name.Name == "serial" || name.Name == "serialQuiet" || name.Name == "parallelLong") && len(call.Args) == 2:
		if lit, ok := call.Args[1].(*ast.BasicLit); ok && lit.Kind == token.STRING && len(lit.Value) > 2 {
			return name.Name
		}
	}
	return ""
}

// The slots admit as many tests at once as they have, and a long test
// waiting goes before ordinary ones that arrived earlier: two slots, two
// tests holding them, an ordinary test and then a long one queued; the
// first slot given back goes to the long one, the next to the ordinary.
func TestSlotsStartLongTestsFirst(t *testing.T) {
	parallel(t)
	s := &testSlots{free: 2}
	for i := 0; i < 2; i++ {
		select {
		case <-s.queue(false):
		default:
			t.Fatalf("test %d of 2 waits with a slot free", i+1)
		}
	}
	ordinary, long := s.queue(false), s.queue(true)
	isReady := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	if isReady(ordinary) || isReady(long) {
		t.Fatal("a third test started with both slots held")
	}
	s.give()
	if !isReady(long) || isReady(ordinary) {
		t.Fatalf("after one slot came back: long started %v, ordinary %v; want the long one first", isReady(long), isReady(ordinary))
	}
	s.give()
	if !isReady(ordinary) {
		t.Fatal("the ordinary test did not start when the second slot came back")
	}
	s.give()
	s.give()
	if s.free != 2 {
		t.Fatalf("%d slots free after every test gave its back, want 2", s.free)
	}
}
