# calltap — the two set-up commands on a fresh machine are `make demo` and `make test`.
GO        ?= go
BIN       := bin/calltap
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)

.PHONY: build test vet demo bench fuzz clean

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/calltap

vet:
	$(GO) vet ./...

# vet, then the whole suite with the race detector, then a short fuzz of the
# frame decoder.
test: vet
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) test -run '^$$' -fuzz FuzzDecodeFrame -fuzztime 15s ./relay/

# Runs `calltap dev` with a small sample handler and sends sample call events.
demo: build
	./scripts/demo

bench: build
	./scripts/bench

clean:
	rm -rf bin
