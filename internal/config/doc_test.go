package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestReferenceDocumentsEveryKey keeps docs/configuration.md complete: each
// TOML key of Config (nested ones as parent.child, handler fields as
// runtime_handlers.<name>.field) must appear there in backquotes.
func TestReferenceDocumentsEveryKey(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(prefix string, typ reflect.Type)
	walk = func(prefix string, typ reflect.Type) {
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			key := prefix + strings.Split(f.Tag.Get("toml"), ",")[0]
			switch {
			case f.Type.Kind() == reflect.Struct:
				walk(key+".", f.Type)
			case f.Type.Kind() == reflect.Map && f.Type.Elem().Kind() == reflect.Struct:
				walk(key+".<name>.", f.Type.Elem())
			default:
				keys = append(keys, key)
			}
		}
	}
	walk("", reflect.TypeOf(Config{}))
	if len(keys) < 20 {
		t.Fatalf("found only %d keys: %v", len(keys), keys)
	}
	for _, k := range keys {
		if !strings.Contains(string(doc), "`"+k+"`") {
			t.Errorf("docs/configuration.md does not document `%s`", k)
		}
	}
}

func TestTracingValidation(t *testing.T) {
	for _, c := range []struct {
		t  Tracing
		ok bool
	}{
		{Default().Tracing, true},
		{Tracing{Enable: true, Protocol: TracingProtocolHTTP, SamplingRate: 0.5}, true},
		{Tracing{Protocol: "udp"}, false},
		{Tracing{SamplingRate: 1.5}, false},
		{Tracing{SamplingRate: -0.1}, false},
	} {
		cfg := Default()
		cfg.Tracing = c.t
		err := cfg.Validate()
		if (err == nil) != c.ok {
			t.Errorf("%+v: Validate() = %v", c.t, err)
		}
		if err == nil && (cfg.Tracing.Endpoint == "" || cfg.Tracing.ServiceName == "" || cfg.Tracing.Protocol == "") {
			t.Errorf("%+v: defaults not filled: %+v", c.t, cfg.Tracing)
		}
	}
}
