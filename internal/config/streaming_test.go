package config

import "testing"

func TestStreamingInsecure(t *testing.T) {
	for _, tc := range []struct {
		addr, cert string
		want       bool
	}{
		{"127.0.0.1:0", "", false},
		{"127.0.0.5:10010", "", false},
		{"[::1]:0", "", false},
		{"localhost:10010", "", false},
		{":10010", "", true},
		{"0.0.0.0:10010", "", true},
		{"[::]:10010", "", true},
		{"10.0.0.7:10010", "", true},
		{"node.example.com:10010", "", true},
		{"0.0.0.0:10010", "/etc/berth/stream.crt", false},
	} {
		c := &Config{StreamingAddress: tc.addr, StreamingTLSCert: tc.cert}
		if got := c.StreamingInsecure(); got != tc.want {
			t.Errorf("StreamingInsecure(%q, cert %q) = %v, want %v", tc.addr, tc.cert, got, tc.want)
		}
	}
}
