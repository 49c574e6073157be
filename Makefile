# berth: a Kubernetes CRI runtime.
#   make run     install what berthd needs, build, run berthd in the foreground
#   make test    install what tests need, lint, run the whole suite
#   make bench   benchmarks: tables on stdout, JSON under bench/out
#   make conformance  critest against a private berthd (not part of make test)
#   make e2e-node     the Kubernetes node e2e suite against a private berthd
#                     (not part of make test; docs/conformance.md)
#   make e2e-cluster  a two-node cluster of berth nodes on this machine and the
#                     upstream [Conformance] suite against it (not part of make
#                     test; hours; docs/e2e-cluster.md)
#   make test-kubelet the kubelet test alone (part of make test), verbose
#   make test-guest   the cgroup v2 lane alone (part of make test): the cgroup
#                     tests in a qemu guest, cgroupfs and systemd drivers, crun;
#                     BERTH_GUEST_KUBELET=1 adds the kubelet test (systemd)
#   make install      install berthd, berth-shim, berth-lazy, berth-pause, berthctl, the
#                     systemd unit and (where none exists) /etc/berth/berth.toml
#                     and /etc/crictl.yaml; PREFIX (/usr/local), DESTDIR;
#                     make uninstall removes them (docs/operations.md)
#   make deb          the Debian package, out/deb/berth_<version>_<arch>.deb
#                     (dpkg-deb; decision 3730)
#   make k8s-bins     build the kubelet, e2e_node.test, agnhost, ginkgo, critest
#                     and crictl from test/k8s into a cache; prints the directory
#                     (hack/k8s-bins.sh cluster: what make e2e-cluster runs)
GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
BIN       := $(CURDIR)/bin
STATICCHECK_VERSION := v0.8.2
# make install's prefix and staging root (the Debian package: /usr).
PREFIX    ?= /usr/local
DESTDIR   ?=
# Extra berthd flags for make run, e.g. make run ARGS="--log-level debug".
ARGS      ?=
# go test flags for make test, e.g. TESTFLAGS="-run TestImage -v".
TESTFLAGS ?=
# The criu the checkpoint/restore tests and benchmarks run: the one CI
# copies beside the checkout (../shared/tools/criu; Debian's criu fails on
# these machines' kernels), put first on PATH when present.
CRIU_DIR  ?= $(abspath $(CURDIR)/../shared/tools/criu)
TEST_PATH := $(if $(wildcard $(CRIU_DIR)/criu),$(CRIU_DIR):)$(PATH)
# How long make test fuzzes each target (their corpora also run as tests).
FUZZTIME  ?= 10s

.PHONY: all build run test fuzz lint deps test-deps bench clean k8s-bins conformance e2e-node e2e-cluster test-kubelet test-guest install uninstall deb soak soak-guest

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/berth-shim ./cmd/berth-lazy

deps:
	hack/install-deps.sh run

# Installing on a node (docs/operations.md, decision 3730): what
# hack/install.sh installs and removes, and the Debian package built from
# the same tree by hack/deb.sh.
install: build
	BIN=$(BIN) PREFIX=$(PREFIX) DESTDIR=$(DESTDIR) hack/install.sh install

uninstall:
	BIN=$(BIN) PREFIX=$(PREFIX) DESTDIR=$(DESTDIR) hack/install.sh uninstall

deb: build
	BIN=$(BIN) hack/deb.sh

test-deps:
	hack/install-deps.sh test

run: deps build
	$(BIN)/berthd $(ARGS)

# bench/ is a module of its own (its chart library stays out of the
# daemon's go.mod); lint and test cover it too. The shape limits: no
# function unreachable from a main or a test (deadcode -test), and
# hack/shapecheck (no non-test file over 800 lines nor function over 120,
# anywhere in the repository: cmd/, internal/, hack/, test/ and bench/;
# every directory of Go code named in docs/architecture.md).
lint: DEADCODE_VERSION := v0.52.0
lint:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	cd bench && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) run ./hack/shapecheck
	@dead=$$($(GO) run golang.org/x/tools/cmd/deadcode@$(DEADCODE_VERSION) -test ./...) || exit 1; \
	  if [ -n "$$dead" ]; then echo "unreachable functions (deadcode -test):"; echo "$$dead"; exit 1; fi

# The kubelet test runs after the other packages, not beside them: it
# changes what the whole host sees (a hugetlb hierarchy mounted for its
# hugepages case, which criu in the checkpoint tests then walks) and loads
# both cores for minutes.
test: test-deps lint build
	cosign=$$(hack/cosign-bins.sh) && PATH="$(TEST_PATH)" BERTHD_BIN=$(BIN)/berthd BERTH_BIN_DIR=$(BIN) BERTH_COSIGN_DIR=$$cosign \
	  $(GO) test -count=1 -timeout 60m $(TESTFLAGS) $$($(GO) list ./... | grep -v '/test/kubelet$$')
	PATH="$(TEST_PATH)" BERTHD_BIN=$(BIN)/berthd BERTH_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 30m $(TESTFLAGS) ./test/kubelet/
	cd bench && $(GO) test -count=1 $(TESTFLAGS) ./...
	$(MAKE) fuzz
	$(MAKE) test-guest

# The cgroup v2 lane (docs/decisions/2200-cgroup-v2-guest-lane.md): a Debian
# guest under qemu (image built once into /var/cache/berth-guest) runs the
# integration tests that touch cgroups under both drivers and with crun.
# Its last line says PASS or FAIL; it fails on any failure or timeout.
test-guest: build
	hack/install-deps.sh guest
	BIN=$(BIN) hack/guest/lane.sh

# The soak's short form in the cgroup v2 guest, both drivers (issue 35;
# not in make test: about 20 minutes of TCG; decision 3500).
soak-guest: build
	hack/install-deps.sh guest
	BIN=$(BIN) BERTH_GUEST_SOAK=only BERTH_GUEST_ONLY=passes hack/guest/lane.sh

# The kubelet test alone (docs/kubelet.md): a real kubelet, built by
# hack/k8s-bins.sh, runs static pods on a private berthd.
test-kubelet: test-deps build
	BERTHD_BIN=$(BIN)/berthd BERTH_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 30m -v $(TESTFLAGS) ./test/kubelet/

# The soak (not part of make test; docs/reliability.md, "Soak"): a real
# kubelet runs a full node (SOAK_PODS, default 110) on a private berthd for
# SOAK_MINUTES of churn and faults, then the node is torn down and checked
# for leftovers. Its table is printed; soak.json, soak.md and the daemons'
# logs go to out/soak/<time>/. SOAK_SEED repeats a run's random choices,
# SOAK_FAULTS picks faults (comma-separated), SOAK_CHURN sets the pods
# replaced a minute.
SOAK_MINUTES ?= 60
soak: test-deps build
	PATH="$(TEST_PATH)" BERTHD_BIN=$(BIN)/berthd BERTH_BIN_DIR=$(BIN) SOAK_MINUTES=$(SOAK_MINUTES) \
	  $(GO) test -count=1 -timeout $$(( $(SOAK_MINUTES) + 45 ))m -v -run '^TestSoak$$' ./test/soak/

# Bounded fuzzing of the CRI→OCI translation, the CRI log writer, the
# JSON scanner (internal/jsonlite: the shim protocol's codec, both sides,
# and the OCI runtime's log and state reader), and the hostile-input parsers
# of issue 34 (hosts.toml, policy.json, the image's user database, the layer
# unpacker, the image importer); a crash found here lands in the package's
# testdata/fuzz as a regression test.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzBuild$$' -fuzztime $(FUZZTIME) ./internal/specgen/
	$(GO) test -run '^$$' -fuzz '^FuzzLineSplitter$$' -fuzztime $(FUZZTIME) ./internal/shim/monitor/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./internal/jsonlite/
	$(GO) test -run '^$$' -fuzz '^FuzzParseHostsFile$$' -fuzztime $(FUZZTIME) ./internal/image/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/sigpolicy/
	$(GO) test -run '^$$' -fuzz '^FuzzResolveUser$$' -fuzztime $(FUZZTIME) ./internal/specgen/
	# The layer unpacker and the image importer (issue 34; as root: they chown and mknod).
	$(GO) test -run '^$$' -fuzz '^FuzzUnpack$$' -fuzztime $(FUZZTIME) ./internal/image/
	$(GO) test -run '^$$' -fuzz '^FuzzImportArchive$$' -fuzztime $(FUZZTIME) ./internal/image/

bench: build
	hack/install-deps.sh bench
	mkdir -p bench/out
	cd bench && PATH="$(TEST_PATH)" BERTHD_BIN=$(BIN)/berthd BERTH_BIN_DIR=$(BIN) BENCH_OUT=$(CURDIR)/bench/out \
	  $(GO) test -count=1 -timeout 120m -run '^$$' -bench . -benchtime 1x ./...

# Kubernetes programs from the Go module proxy (test/k8s has its own go.mod),
# built once into ${BERTH_K8S_CACHE:-/var/cache/berth-k8s}/<version>-<key>.
k8s-bins:
	@hack/k8s-bins.sh

# The CRI validation suite and its benchmarks against a private berthd;
# reports under out/conformance/<time>/ (docs/conformance.md).
conformance:
	hack/install-deps.sh conformance
	hack/conformance.sh

# The Kubernetes node e2e suite ([NodeConformance]: a parallel pass, then
# the [Serial] specs) against a private berthd, with the kubelet the suite
# runs itself; reports under out/e2e-node/<time>/ (docs/conformance.md).
e2e-node:
	hack/e2e-node.sh

# A two-node cluster of berth nodes (control plane, kubelets, kube-proxy,
# CoreDNS, all built from test/k8s), the [Conformance] specs of e2e.test
# against it (a parallel pass, then the [Serial] specs); reports under
# out/e2e-cluster/<time>/ (docs/e2e-cluster.md). E2E_CLUSTER_MODE=smoke
# only brings it up, checks it and tears it down.
e2e-cluster:
	hack/e2e-cluster.sh $(E2E_CLUSTER_MODE)

clean:
	rm -rf $(BIN) bench/out out
