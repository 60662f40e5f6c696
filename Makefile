# calltap — on a fresh machine: `make demo` to see it work, `make test` to
# check it, `make install` to put calltap on your PATH.
GO        ?= go
BIN       := bin/calltap
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
# make install puts calltap in $(PREFIX)/bin: GOPATH's bin by default (on
# PATH for most Go users), or e.g. PREFIX=/usr/local.
PREFIX    ?= $(shell $(GO) env GOPATH)

.PHONY: build install check-tools test vet lint demo demo-build bench fuzz clean chaos mutation

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/calltap

install:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(DESTDIR)$(PREFIX)/bin/calltap ./cmd/calltap
	@echo "installed $(DESTDIR)$(PREFIX)/bin/calltap"

# What the suite needs and the machine lacks (a C compiler, Chromium), in a
# second, with the command that installs it.
check-tools:
	@./scripts/check-tools

vet:
	$(GO) vet ./...

# staticcheck, deadcode and gocyclo, fetched at pinned versions by go run so
# a fresh machine needs nothing installed; then no package above 4,000
# lines of non-test Go (scripts/check-size). deadcode counts what tests use as
# used, so a helper that only tests call is not reported. gocyclo holds every
# function outside tests to a cyclomatic complexity of 15: one a reader
# holds at once.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
DEADCODE    := golang.org/x/tools/cmd/deadcode@v0.52.0
GOCYCLO     := github.com/fzipp/gocyclo/cmd/gocyclo@v0.6.0

lint:
	$(GO) run $(STATICCHECK) ./...
	@out=$$($(GO) run $(GOCYCLO) -over 15 -ignore '_test' cmd relay inspector web storage scripts 2>&1) || { echo "$$out"; echo "gocyclo: functions above complexity 15 (split them into named steps)"; exit 1; }
	@out=$$($(GO) run $(DEADCODE) -test ./...) && if [ -n "$$out" ]; then echo "$$out"; echo "deadcode: unused functions above"; exit 1; fi
	@./scripts/check-size 4000

# The tools first (prerequisites run left to right), then vet and lint, then
# the whole suite with the race detector, then short fuzzes.
test: check-tools vet lint
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) test -run '^$$' -fuzz FuzzDecodeFrame -fuzztime 15s ./relay/wire/
	$(GO) test -run '^$$' -fuzz FuzzPathRule -fuzztime 15s ./relay/tunnelpath/
	$(GO) test -run '^$$' -fuzz FuzzImport -fuzztime 15s ./inspector/
	$(GO) test -run '^$$' -fuzz FuzzScan -fuzztime 15s ./inspector/routes/
	$(GO) test -run '^$$' -fuzz FuzzLookup -fuzztime 15s ./relay/claim/

# Runs `calltap dev` with a small sample handler and sends sample call events.
demo: demo-build
	@./scripts/demo

# The first build compiles SQLite (cgo), a minute or more on a small machine:
# it is built first, on its own, under one line that names it and counts
# the seconds (the same flags as the build after, so that it reuses it).
# Before it starts, one line says how long to expect: 3 min 33 s were seen
# on a busy fresh 2-core machine.
demo-build:
	@echo "make demo: building calltap; the first build on a fresh machine takes 2 to 4 minutes (SQLite is compiled once), later ones seconds" >&2
	@./scripts/with-status "make demo: compiling SQLite (github.com/mattn/go-sqlite3, first build only)" $(GO) build -trimpath github.com/mattn/go-sqlite3
	@./scripts/with-status "make demo: building calltap" $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/calltap

# A chaos run (scripts/chaos): the built calltap as separate processes (a
# team relay over three NATS servers, or CHAOS_ARGS=--single for one relay),
# traffic like the voice service's, faults from a schedule CHAOS_SEED draws
# (0: a seed from the clock), then the checker's verdict and an HTML report
# in bin/chaos/<mode>-<seed>/. CHAOS_BIN tests another build of calltap.
CHAOS_MINUTES ?= 3
CHAOS_SEED    ?= 0
CHAOS_BIN     ?= $(BIN)
CHAOS_ARGS    ?=

chaos: build
	$(GO) build -o bin/nats-server github.com/nats-io/nats-server/v2
	$(GO) build -o bin/calltap-chaos ./scripts/chaos
	./bin/calltap-chaos -minutes $(CHAOS_MINUTES) -seed $(CHAOS_SEED) -bin $(CHAOS_BIN) -nats-server bin/nats-server $(CHAOS_ARGS)

bench: build
	./scripts/bench

# Mutation testing (gremlins) of the answer path's packages, each with its
# own tests only: fails when a package kills under 85% of the mutants its
# tests reach (efficacy) or reaches under 70% of them (mutator coverage).
# Slow (each mutant runs the package's tests; storage/agentdb's take most
# of an hour), so not part of make test. GOFLAGS=-count=1: a cached test run
# would make gremlins' per-mutant time limit a fraction of a second.
GREMLINS      := github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0
MUTATION_PKGS ?= ./inspector/agent ./storage/intake ./storage/agentdb ./storage/relaydb ./storage/servicedb ./storage/varfield

mutation:
	@for p in $(MUTATION_PKGS); do echo "== $$p"; \
		GOFLAGS=-count=1 $(GO) run $(GREMLINS) unleash --workers 1 --timeout-coefficient 5 \
			--threshold-efficacy 85 --threshold-mcover 70 $$p || exit 1; done
	@echo "== ./storage (the core alone)"
	GOFLAGS=-count=1 $(GO) run $(GREMLINS) unleash --workers 1 --timeout-coefficient 5 \
		--threshold-efficacy 85 --threshold-mcover 70 -E '^[a-z]+/' ./storage

clean:
	rm -rf bin
