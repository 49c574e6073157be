// Package cditest holds a Container Device Interface spec for a fake
// device, for the cdi package's tests and the integration tests.
package cditest

// FakeSpec is a CDI spec for vendor berth.test, class fake: two devices
// backed by /dev/null, each with its own env; every injection of either
// also gets a read-only bind of info and a createRuntime hook that
// appends a line to hookLog.
func FakeSpec(info, hookLog string) string {
	return `{
  "cdiVersion": "0.6.0",
  "kind": "berth.test/fake",
  "devices": [
    {"name": "dev0", "containerEdits": {"deviceNodes": [{"path": "/dev/berth-fake0", "hostPath": "/dev/null"}], "env": ["FAKE_DEVICE0=yes"]}},
    {"name": "dev1", "containerEdits": {"deviceNodes": [{"path": "/dev/berth-fake1", "hostPath": "/dev/null", "permissions": "rw"}], "env": ["FAKE_DEVICE1=yes"]}}
  ],
  "containerEdits": {
    "mounts": [{"hostPath": "` + info + `", "containerPath": "/run/fake/info", "options": ["ro", "bind"]}],
    "hooks": [{"hookName": "createRuntime", "path": "/bin/sh", "args": ["sh", "-c", "echo ran >> ` + hookLog + `"]}]
  }
}`
}
