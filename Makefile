# ferry — top-level build. `make` builds bin/ferry; `make check` installs
# dependencies, builds and runs every test; see README.md.

PREFIX ?= /usr/local
DESTDIR ?=
BUILD ?= build
BIN ?= bin
CC ?= cc
SAN ?=
# The release: VERSION is its one source (ferry --version, ferryd --version,
# the registry User-Agent; contrib/containerd/go.sh for ferry-snapshotter).
VERSION := $(shell cat VERSION)

# ISA-L's igzip inflates gzip layers about twice as fast as zlib; where it is
# absent at build time, zlib (always built, FERRY_INFLATE=zlib) does alone.
ISAL := $(shell pkg-config --exists libisal 2>/dev/null && echo libisal)
PKGS := libcurl liblz4 libzstd liblzma zlib json-c libcrypto fuse3 $(ISAL)
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CFLAGS ?= -O2 -g
CFLAGS += -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Wall -Wextra -Werror \
	  -Wno-unused-parameter -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
	  -fno-strict-aliasing -pthread $(PKG_CFLAGS) $(if $(ISAL),-DFERRY_HAVE_ISAL) \
	  -DFERRY_VERSION='"$(VERSION)"'
ifeq ($(SAN),1)
CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
LDFLAGS += -pthread
LDLIBS += -Wl,--as-needed $(PKG_LIBS)

MODULES := pkg-base pkg-meta pkg-blob pkg-fetch pkg-image pkg-convert pkg-serve
LIB_SRCS := $(foreach m,$(MODULES),$(wildcard $(m)/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
LIB := $(BUILD)/libferry.a

# cmd/ctl.c: the ferry <-> ferryd control protocol, linked into both;
# cmd/ctl_client.c: its client side (connecting, starting ferryd).
FERRY_SRCS := $(wildcard cmd/ferry/*.c) cmd/ctl.c cmd/ctl_client.c
FERRY_OBJS := $(FERRY_SRCS:%.c=$(BUILD)/%.o)
# ferryd: the daemon around pkg-serve. The mounts' keepers: a small program
# of their own (pkg-serve/keeper.h) that links what it calls of libferry.a,
# json-c and libc, none of ferryd's other libraries.
FERRYD_SRCS := $(wildcard cmd/ferryd/*.c) cmd/ctl.c
KEEPER_SRCS := $(wildcard cmd/ferryd-keeper/*.c) cmd/ctl.c
FERRYD_OBJS := $(FERRYD_SRCS:%.c=$(BUILD)/%.o)
KEEPER_OBJS := $(KEEPER_SRCS:%.c=$(BUILD)/%.o)

TEST_SRCS := $(wildcard tests/*/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
TOOL_SRCS := $(wildcard tests/tools/*.c)
TOOL_BINS := $(TOOL_SRCS:tests/%.c=$(BUILD)/tests/%)

FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)

# Quiet by default; `make V=1` shows the commands.
Q := $(if $(V),,@)

.PHONY: all check check-asan check-run tests fuzz fuzz-run bench demo deps install uninstall clean vm-kernel contrib

all: $(BIN)/ferry $(BIN)/ferryd $(BIN)/ferryd-keeper

# The containerd snapshotter (Go, built offline from Debian's Go sources:
# contrib/containerd/go.sh, docs/containerd.md).
contrib: $(BIN)/ferry-snapshotter

$(BIN)/ferry-snapshotter: $(wildcard contrib/containerd/ferry-snapshotter/*.go) contrib/containerd/go.sh VERSION
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GO      $@")
	$(Q)contrib/containerd/go.sh build -o $(abspath $@)

# Each object depends on the headers it includes (-MMD writes them to its .d
# file, read below), not on every header of the tree. Tests and fuzz targets
# are binaries: theirs are dot files beside them (.NAME.d), which the test
# runners' globs (test_*, fuzz_*) do not match.
DEPFLAGS = -MMD -MP

$(BUILD)/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) -c -o $@ $<

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BIN)/ferry: $(FERRY_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BIN)/ferryd: $(FERRYD_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BIN)/ferryd-keeper: $(KEEPER_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c Makefile $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TEST    $@")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) -MF $(dir $@).$(notdir $@).d $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# tests/ctl: the control protocol and the CLI's registry options.
CTL_TEST_OBJS := $(BUILD)/cmd/ctl.o $(BUILD)/cmd/ferry/regopts.o
$(BUILD)/tests/ctl/%: tests/ctl/%.c Makefile $(CTL_TEST_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TEST    $@")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) -MF $(dir $@).$(notdir $@).d $(LDFLAGS) -o $@ $< $(CTL_TEST_OBJS) $(LIB) $(LDLIBS)

# tests/serve: pkg-serve, which speaks the control protocol (cmd/ctl.c).
$(BUILD)/tests/serve/%: tests/serve/%.c Makefile $(BUILD)/cmd/ctl.o $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TEST    $@")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) -MF $(dir $@).$(notdir $@).d $(LDFLAGS) -o $@ $< $(BUILD)/cmd/ctl.o $(LIB) $(LDLIBS)

tests: $(TEST_BINS) $(TOOL_BINS)

# libFuzzer targets for every parser of untrusted input (clang only). The
# libraries are compiled once, instrumented, into one archive the targets
# link (each target compiling them all took 26 s, 3.5 min for 8).
FUZZ_COMMON := -g -O1 -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -pthread \
	       $(PKG_CFLAGS) $(if $(ISAL),-DFERRY_HAVE_ISAL) -DFERRY_VERSION='"$(VERSION)"'
FUZZ_LIB := $(BUILD)/fuzz/libferry-fuzz.a
FUZZ_LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/fuzz/obj/%.o)
$(BUILD)/fuzz/obj/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZCC  $<")
	$(Q)clang $(FUZZ_COMMON) $(DEPFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c -o $@ $<
$(FUZZ_LIB): $(FUZZ_LIB_OBJS)
	$(Q)rm -f $@ && ar rcs $@ $^
$(BUILD)/fuzz/%: tests/fuzz/%.c $(FUZZ_LIB) Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZ    $@")
	$(Q)clang $(FUZZ_COMMON) $(DEPFLAGS) -MF $(dir $@).$(notdir $@).d -fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_EXTRA) \
		$(FUZZ_LIB) $(PKG_LIBS)

# The control-socket parsers live outside the libraries.
$(BUILD)/fuzz/fuzz_ctl: FUZZ_EXTRA := cmd/ctl.c
$(BUILD)/fuzz/fuzz_ctl: cmd/ctl.c

fuzz: $(FUZZ_BINS)

# Every object is compiled with the release (-DFERRY_VERSION): rebuilt when it changes.
$(LIB_OBJS) $(FERRY_OBJS) $(FERRYD_OBJS) $(KEEPER_OBJS) $(TEST_BINS) $(FUZZ_LIB_OBJS): VERSION

# The headers each object, test and fuzz target was compiled with.
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# Short bounded fuzz runs over the seed corpora (part of `make check`).
fuzz-run: fuzz
	BUILD=$(BUILD) tests/fuzz/run.sh $(FUZZ_BINS)

deps:
	@tests/deps.sh

# The VM tests' kernel (cachefiles on-demand), built once per machine and
# cached under /var/tmp/ferry-vm (tests/vm/build-kernel.sh; docs/TESTING.md).
vm-kernel: deps
	tests/vm/build-kernel.sh

# The test targets build with every CPU (CI calls plain `make check`).
JOBS ?= $(shell nproc 2>/dev/null || echo 1)

check: deps
	$(MAKE) -j$(JOBS) all tests fuzz contrib
	BUILD=$(BUILD) BIN=$(BIN) tests/run.sh

# Not under the sanitizers (CI time; docs/TESTING.md): tests whose ferry
# code paths the lazy-mount tests already cover and whose cost is peers
# (containerd, the Go snapshotter) or a slow proxy (the WAN harness);
# node_faults_containerd's ferryd kills are node_faults_*'s, which run
# under ASan; containerd_index's probe opens an image as index_lazy's
# mounts do; the cachefiles mode's code runs under ASan in vm_cachefiles,
# the index and native-layer images' in index_lazy and erofs_layers_lazy
# (each QEMU/TCG guest runs beside VM tests only, minutes of CI each).
ASAN_SKIP = e2e/containerd e2e/containerd_trust e2e/cri e2e/snapshotter e2e/wan_lazy \
	e2e/node_faults_containerd e2e/containerd_index e2e/vm_cachefiles_index \
	e2e/vm_cachefiles_layers

check-asan: deps
	$(MAKE) -j$(JOBS) BUILD=build-asan BIN=build-asan/bin SAN=1 all tests
	BUILD=build-asan BIN=build-asan/bin ASAN_OPTIONS=detect_leaks=1 \
		FERRY_TESTS_SKIP="$(ASAN_SKIP)" tests/run.sh

bench: deps all tests
	BIN=$(BIN) bench/run.sh
	BIN=$(BIN) bench/index.sh
	BIN=$(BIN) bench/native.sh
	BIN=$(BIN) bench/lazy.sh
	BIN=$(BIN) bench/memory.sh
	BIN=$(BIN) BUILD=$(BUILD) bench/failover.sh
	BIN=$(BIN) bench/wan.sh $(BIN)
	BIN=$(BIN) bench/vm_cachefiles.sh
	BIN=$(BIN) bench/containerd.sh
	BIN=$(BIN) bench/peers.sh
	BIN=$(BIN) bench/fetchread.sh $(BIN)

demo: deps all
	BIN=$(BIN) tests/demo.sh

# Installation: DESTDIR stages it, PREFIX is where it runs from; the
# snapshotter's configuration goes to SYSCONFDIR/ferry (never overwritten),
# containerd's config snippet to DATADIR. The snapshotter's binary, unit
# and configuration come along once 'make contrib' has built it.
SYSCONFDIR ?= /etc
BINDIR = $(PREFIX)/bin
MANDIR = $(PREFIX)/share/man
UNITDIR = $(PREFIX)/lib/systemd/system
DATADIR = $(PREFIX)/share/ferry
SNAPSHOTTER_CONFIG = $(DESTDIR)$(SYSCONFDIR)/ferry/snapshotter.json
UNIT_SED = sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g'

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man8 \
		$(DESTDIR)$(UNITDIR)
	install -m 0755 $(BIN)/ferry $(BIN)/ferryd $(BIN)/ferryd-keeper $(DESTDIR)$(BINDIR)/
	install -m 0644 docs/man/ferry.1 $(DESTDIR)$(MANDIR)/man1/ferry.1
	install -m 0644 docs/man/ferryd.8 $(DESTDIR)$(MANDIR)/man8/ferryd.8
	install -m 0644 contrib/systemd/ferryd.socket $(DESTDIR)$(UNITDIR)/ferryd.socket
	$(UNIT_SED) contrib/systemd/ferryd.service.in > $(DESTDIR)$(UNITDIR)/ferryd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/ferryd.service
	@if [ ! -e $(BIN)/ferry-snapshotter ]; then \
		echo "make install: ferry-snapshotter is not built ('make contrib'): its binary, unit and configuration are left out"; \
	else \
		set -e; \
		install -m 0755 $(BIN)/ferry-snapshotter $(DESTDIR)$(BINDIR)/ferry-snapshotter; \
		$(UNIT_SED) contrib/systemd/ferry-snapshotter.service.in \
			> $(DESTDIR)$(UNITDIR)/ferry-snapshotter.service; \
		chmod 0644 $(DESTDIR)$(UNITDIR)/ferry-snapshotter.service; \
		install -d $(DESTDIR)$(DATADIR) $(DESTDIR)$(SYSCONFDIR)/ferry; \
		install -m 0644 contrib/containerd/config.toml $(DESTDIR)$(DATADIR)/containerd-config.toml; \
		if [ -e $(SNAPSHOTTER_CONFIG) ]; then \
			echo "make install: $(SNAPSHOTTER_CONFIG) exists: kept"; \
		else \
			install -m 0644 contrib/containerd/snapshotter.json $(SNAPSHOTTER_CONFIG); \
		fi; \
	fi

# Removes what install put in place; the snapshotter's configuration only
# as installed (an edited one is kept, and said so).
uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,ferry ferryd ferryd-keeper ferry-snapshotter) \
		$(DESTDIR)$(MANDIR)/man1/ferry.1 $(DESTDIR)$(MANDIR)/man8/ferryd.8 \
		$(addprefix $(DESTDIR)$(UNITDIR)/,ferryd.socket ferryd.service ferry-snapshotter.service) \
		$(DESTDIR)$(DATADIR)/containerd-config.toml
	@if [ -e $(SNAPSHOTTER_CONFIG) ]; then \
		if cmp -s contrib/containerd/snapshotter.json $(SNAPSHOTTER_CONFIG); then \
			rm -f $(SNAPSHOTTER_CONFIG); \
		else \
			echo "make uninstall: $(SNAPSHOTTER_CONFIG) was edited: kept"; \
		fi; \
	fi
	-rmdir $(DESTDIR)$(DATADIR) $(DESTDIR)$(SYSCONFDIR)/ferry 2>/dev/null

clean:
	rm -rf build build-asan bin
