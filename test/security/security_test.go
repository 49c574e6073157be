// Package security holds berth's hostile tests (issue 34): each test plays
// an attacker — an unprivileged host user, a hostile image, registry,
// archive or CRI client — against a real berthd, and proves one row of
// docs/security.md. Each test is built so that it fails on a berthd
// without the defence it names. Tests need root; the host user is
// `nobody`.
package security
