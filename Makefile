# calltap — the two set-up commands on a fresh machine are `make demo` and `make test`.
GO        ?= go
BIN       := bin/calltap
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)

.PHONY: build test vet lint demo bench fuzz clean

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/calltap

vet:
	$(GO) vet ./...

# staticcheck and deadcode, fetched at pinned versions by go run so a fresh
# machine needs nothing installed. deadcode counts what tests use as used, so
# a helper that only tests call is not reported.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
DEADCODE    := golang.org/x/tools/cmd/deadcode@v0.52.0

lint:
	$(GO) run $(STATICCHECK) ./...
	@out=$$($(GO) run $(DEADCODE) -test ./...) && if [ -n "$$out" ]; then echo "$$out"; echo "deadcode: unused functions above"; exit 1; fi

# vet and lint, then the whole suite with the race detector, then a short
# fuzz of the frame decoder.
test: vet lint
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) test -run '^$$' -fuzz FuzzDecodeFrame -fuzztime 15s ./relay/
	$(GO) test -run '^$$' -fuzz FuzzImport -fuzztime 15s ./inspector/

# Runs `calltap dev` with a small sample handler and sends sample call events.
demo: build
	./scripts/demo

bench: build
	./scripts/bench

clean:
	rm -rf bin
