# Thin make layer over cargo: the versioned shared library, install, C tests.
#
#   make                 release build + target/lib/librdmamig.so.$(VERSION)
#   make install         PREFIX=/usr/local, DESTDIR honoured, LIBDIR=$(PREFIX)/lib; the
#                        man(3) pages into MANDIR=$(PREFIX)/share/man when doxygen is there
#   make c-tests         build capi/c-tests/*.c into target/c-tests/ (ASan/UBSan), and
#                        capi/c-tests/rdma_test_*.c without sanitizers into
#                        target/c-tests-valgrind/ (rdma-suite.sh's valgrind steps);
#                        the integration examples examples/c/*.c both ways, as
#                        rdma_test_example_* (run by rdma-suite.sh), and the
#                        minimal pair examples/c/minimal/*.c both ways, as
#                        minimal_destination and minimal_source
#   make check           run the host C tests (capi/c-tests/test_*.c)
#   make generate        regenerate the C side's mirrors of the library's lists, then the header
#   make header          regenerate capi/include/rdmamig.h (cbindgen 0.29.4)
#   make symbols         regenerate the golden lists capi/abi/symbols.txt and values.txt
#   make check-abi       scripts/check-abi.sh on the built library
#   make docs            the C API reference (Doxygen, warnings as errors): target/doc-c/html/
#                        and the man(3) pages, target/doc-c/man/man3/ (`make man`: only those)
#   make demo            the C demo hypervisor (capi/c-tests/rdma_test_demo.c) in an rxe guest
#                        (scripts/demo.sh: installs what is missing first)
#   make deb             the Debian packages into target/deb/ (scripts/deb.sh)
#   make bench           the migration benchmark (examples/bench.rs, scripts/bench.sh): ib_write_bw,
#                        QEMU -> QEMU and rdmamig <-> rdmamig in one guest boot, one table
#                        (BENCH_ARGS, e.g. BENCH_ARGS=--quick)
#   make bench-postcopy  the post-copy benchmark (examples/postcopy_bench.rs, scripts/postcopy-bench.sh):
#                        fault latency and pull rate against ib_read_lat / ib_read_bw in one guest boot
#                        (BENCH_POSTCOPY_ARGS, e.g. BENCH_POSTCOPY_ARGS=--quick)
#   make bench-qemu      QEMU 10.2 patched (librdmamig) against stock over rdma and TCP, a running
#                        Linux guest, median of 3 guest boots (scripts/bench-qemu.sh)
#   make bench-qemu-postcopy  QEMU 10.2 post-copy, patched over rdma against stock over TCP:
#                        the guest's fault latency, QEMU's blocktime, the phase's time, against
#                        ib_read_lat, median of 3 guest boots (scripts/bench-qemu-postcopy.sh)
#   make bench-demo      the demo, optimised and without sanitizers, next to ib_write_bw in one guest boot
#   make bench-unregister  the unregistration worker on vs off (examples/unregister_bench.rs), 3 guest boots
#   make bench-registration  pin-all against a bare ibv_reg_mr loop over the same memory
#                        (examples/registration_bench.rs, scripts/bench-registration.sh), 3 guest boots
#   make bench-native    the library's CPU cost per GiB and its tables at 1, 2, 4 TiB, on the host
#                        (no RDMA device, no guest; examples/native_bench.rs, scripts/bench-native.py),
#                        plots into docs/ (BENCH_NATIVE_ARGS, e.g. BENCH_NATIVE_ARGS=--quick)
#
# The shared library is linked here from the staticlib, with the version script
# capi/abi/rdmamig.map and SONAME librdmamig.so.$(MAJOR): rustc gives cdylibs its own
# anonymous version script, which GNU ld refuses to combine with a named one
# (librsvg builds its .so the same way). target/release/librdmamig.so, cargo's
# cdylib, has neither SONAME nor symbol versions: do not ship it.

PREFIX      ?= /usr/local
EXEC_PREFIX ?= $(PREFIX)
LIBDIR      ?= $(EXEC_PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
MANDIR      ?= $(PREFIX)/share/man
DESTDIR     ?=

CARGO    ?= cargo
CBINDGEN ?= cbindgen
CC       ?= cc
INSTALL  ?= install

VERSION := $(shell sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
MAJOR   := $(word 1,$(subst ., ,$(VERSION)))
SONAME  := librdmamig.so.$(MAJOR)
REALNAME := librdmamig.so.$(VERSION)

TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
STATICLIB  := $(TARGET_DIR)/release/librdmamig_capi.a
LIBOUT     := $(TARGET_DIR)/lib
SHLIB      := $(LIBOUT)/$(REALNAME)
CTEST_DIR  := $(TARGET_DIR)/c-tests

# What the staticlib needs (`cargo rustc -- --print native-static-libs`).
NATIVE_LIBS := -libverbs -lrdmacm -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc

SHLIB_LDFLAGS := -shared -Wl,-soname,$(SONAME) \
	-Wl,--version-script,capi/abi/rdmamig.map \
	-Wl,--gc-sections -Wl,-z,relro -Wl,-z,now -Wl,-z,noexecstack -Wl,--no-undefined

CTEST_CFLAGS := -std=c11 -g -O1 -Wall -Wextra -Werror -Wpedantic \
	-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
	-Icapi/include
CTEST_LDFLAGS := -fsanitize=address,undefined -L$(LIBOUT) -Wl,-rpath,'$$ORIGIN/../lib'
CTEST_SRCS := $(wildcard capi/c-tests/*.c)
CTEST_BINS := $(patsubst capi/c-tests/%.c,$(CTEST_DIR)/%,$(CTEST_SRCS))
HOST_TESTS := $(filter $(CTEST_DIR)/test_%,$(CTEST_BINS))

# The RDMA test programs once more without sanitizers, for valgrind's memcheck
# (which cannot run an ASan binary): same warnings, no -fsanitize.
VG_CTEST_DIR    := $(TARGET_DIR)/c-tests-valgrind
VG_CTEST_CFLAGS := -std=c11 -g -O1 -Wall -Wextra -Werror -Wpedantic -fno-omit-frame-pointer -Icapi/include
VG_CTEST_BINS   := $(patsubst capi/c-tests/%.c,$(VG_CTEST_DIR)/%,$(wildcard capi/c-tests/rdma_test_*.c))

# The integration examples (examples/c/*.c, docs/integration/) are RDMA test
# programs too: target/c-tests/rdma_test_example_*, which scripts/rdma-suite.sh
# runs in the rxe guest, and once more without sanitizers for valgrind.
EXAMPLE_SRCS    := $(wildcard examples/c/*.c)
EXAMPLE_BINS    := $(patsubst examples/c/%.c,$(CTEST_DIR)/rdma_test_example_%,$(EXAMPLE_SRCS))
VG_EXAMPLE_BINS := $(patsubst examples/c/%.c,$(VG_CTEST_DIR)/rdma_test_example_%,$(EXAMPLE_SRCS))

# The minimal example pair (examples/c/minimal/): target/c-tests/minimal_destination
# and minimal_source, both ways. Not rdma_test_*: neither runs alone, so
# rdma-suite.sh runs them together in a step of their own.
MINIMAL_SRCS    := $(wildcard examples/c/minimal/*.c)
MINIMAL_BINS    := $(patsubst examples/c/minimal/%.c,$(CTEST_DIR)/minimal_%,$(MINIMAL_SRCS))
VG_MINIMAL_BINS := $(patsubst examples/c/minimal/%.c,$(VG_CTEST_DIR)/minimal_%,$(MINIMAL_SRCS))

.PHONY: all install uninstall c-tests header-compile check generate header symbols check-abi docs man demo deb bench bench-postcopy bench-qemu bench-qemu-postcopy bench-demo bench-unregister bench-registration bench-native clean FORCE

all: $(LIBOUT)/$(SONAME) $(LIBOUT)/librdmamig.so

# cargo decides whether the staticlib is stale; the .so is relinked only when
# the staticlib, the version script or this Makefile is newer than it, so the
# C tests are not rebuilt needlessly (make re-reads the .so's mtime).
$(SHLIB): FORCE
	$(CARGO) build --release -p rdmamig-capi
	@mkdir -p $(LIBOUT)
	@if [ ! -e $@ ] || [ $(STATICLIB) -nt $@ ] || [ capi/abi/rdmamig.map -nt $@ ] || [ Makefile -nt $@ ]; then \
		echo "$(CC) $(SHLIB_LDFLAGS) -o $@ -Wl,--whole-archive $(STATICLIB) -Wl,--no-whole-archive $(NATIVE_LIBS)"; \
		$(CC) $(SHLIB_LDFLAGS) -o $@.tmp \
			-Wl,--whole-archive $(STATICLIB) -Wl,--no-whole-archive $(NATIVE_LIBS) && \
		mv -f $@.tmp $@; \
	fi

$(LIBOUT)/$(SONAME): $(SHLIB)
	ln -sf $(REALNAME) $@

$(LIBOUT)/librdmamig.so: $(LIBOUT)/$(SONAME)
	ln -sf $(SONAME) $@

$(TARGET_DIR)/rdmamig.pc: pkgconfig/rdmamig.pc.in Cargo.toml Makefile FORCE
	@mkdir -p $(TARGET_DIR)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@EXEC_PREFIX@|$(EXEC_PREFIX)|g' \
	    -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
	    -e 's|@VERSION@|$(VERSION)|g' $< > $(TARGET_DIR)/rdmamig.pc

install: all $(TARGET_DIR)/rdmamig.pc
	$(INSTALL) -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR)
	$(INSTALL) -m 0755 $(SHLIB) $(DESTDIR)$(LIBDIR)/$(REALNAME)
	ln -sf $(REALNAME) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/librdmamig.so
	$(INSTALL) -m 0644 $(STATICLIB) $(DESTDIR)$(LIBDIR)/librdmamig.a
	$(INSTALL) -m 0644 capi/include/rdmamig.h $(DESTDIR)$(INCLUDEDIR)/rdmamig.h
	$(INSTALL) -m 0644 $(TARGET_DIR)/rdmamig.pc $(DESTDIR)$(PKGCONFIGDIR)/rdmamig.pc
	@if command -v doxygen > /dev/null; then \
		bash scripts/docs.sh --man && \
		echo "$(INSTALL) -m 0644 target/doc-c/man/man3/*.3 $(DESTDIR)$(MANDIR)/man3/" && \
		$(INSTALL) -d $(DESTDIR)$(MANDIR)/man3 && \
		$(INSTALL) -m 0644 target/doc-c/man/man3/*.3 $(DESTDIR)$(MANDIR)/man3/; \
	else echo "note: doxygen is not installed: no man(3) pages installed (apt-get install doxygen)"; fi

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/$(REALNAME) $(DESTDIR)$(LIBDIR)/$(SONAME) \
	      $(DESTDIR)$(LIBDIR)/librdmamig.so $(DESTDIR)$(LIBDIR)/librdmamig.a \
	      $(DESTDIR)$(INCLUDEDIR)/rdmamig.h $(DESTDIR)$(PKGCONFIGDIR)/rdmamig.pc \
	      $(DESTDIR)$(MANDIR)/man3/rdmamig*.3 $(DESTDIR)$(MANDIR)/man3/RDMAMIG*.3

# C tests: test_*.c run on any host (`make check`); rdma_test_*.c need an RDMA
# device and are run by scripts/rdma-suite.sh in the rxe guest.
c-tests: all $(CTEST_BINS) $(VG_CTEST_BINS) $(EXAMPLE_BINS) $(VG_EXAMPLE_BINS) $(MINIMAL_BINS) $(VG_MINIMAL_BINS) \
	header-compile

$(CTEST_DIR)/%: capi/c-tests/%.c $(wildcard capi/c-tests/*.h) capi/include/rdmamig.h $(SHLIB) Makefile
	@mkdir -p $(CTEST_DIR)
	$(CC) $(CTEST_CFLAGS) -o $@ $< $(CTEST_LDFLAGS) -lrdmamig
	@nm $@ | grep -q __asan_init || { echo "error: $@ is not linked with ASan" >&2; exit 1; }

$(VG_CTEST_DIR)/%: capi/c-tests/%.c $(wildcard capi/c-tests/*.h) capi/include/rdmamig.h $(SHLIB) $(LIBOUT)/librdmamig.so Makefile
	@mkdir -p $(VG_CTEST_DIR)
	$(CC) $(VG_CTEST_CFLAGS) -o $@ $< -L$(LIBOUT) -Wl,-rpath,'$$ORIGIN/../lib' -lrdmamig -lpthread
	@! nm $@ | grep -q __asan_init || { echo "error: $@ is linked with ASan" >&2; exit 1; }

$(CTEST_DIR)/rdma_test_example_%: examples/c/%.c capi/include/rdmamig.h $(SHLIB) Makefile
	@mkdir -p $(CTEST_DIR)
	$(CC) $(CTEST_CFLAGS) -o $@ $< $(CTEST_LDFLAGS) -lrdmamig

$(VG_CTEST_DIR)/rdma_test_example_%: examples/c/%.c capi/include/rdmamig.h $(SHLIB) $(LIBOUT)/librdmamig.so Makefile
	@mkdir -p $(VG_CTEST_DIR)
	$(CC) $(VG_CTEST_CFLAGS) -o $@ $< -L$(LIBOUT) -Wl,-rpath,'$$ORIGIN/../lib' -lrdmamig

$(CTEST_DIR)/minimal_%: examples/c/minimal/%.c capi/include/rdmamig.h $(SHLIB) Makefile
	@mkdir -p $(CTEST_DIR)
	$(CC) $(CTEST_CFLAGS) -o $@ $< $(CTEST_LDFLAGS) -lrdmamig

$(VG_CTEST_DIR)/minimal_%: examples/c/minimal/%.c capi/include/rdmamig.h $(SHLIB) $(LIBOUT)/librdmamig.so Makefile
	@mkdir -p $(VG_CTEST_DIR)
	$(CC) $(VG_CTEST_CFLAGS) -o $@ $< -L$(LIBOUT) -Wl,-rpath,'$$ORIGIN/../lib' -lrdmamig

# The header must compile on its own as C99, C11 and C++ (cpp_compat).
header-compile: capi/include/rdmamig.h
	@mkdir -p $(CTEST_DIR)
	printf '#include "rdmamig.h"\nint main(void) { return rdmamig_version() == 0; }\n' > $(CTEST_DIR)/header_only.c
	$(CC) -std=c99 -Wall -Wextra -Werror -Wpedantic -Icapi/include -fsyntax-only $(CTEST_DIR)/header_only.c
	$(CC) -std=c11 -Wall -Wextra -Werror -Wpedantic -Wundef -Icapi/include -fsyntax-only $(CTEST_DIR)/header_only.c
	@if command -v $(CXX) >/dev/null 2>&1; then \
		echo "$(CXX) -x c++ -std=c++11 -fsyntax-only"; \
		$(CXX) -x c++ -std=c++11 -Wall -Wextra -Werror -Wpedantic -Wundef -Icapi/include -fsyntax-only $(CTEST_DIR)/header_only.c; \
	else echo "note: no C++ compiler ($(CXX)); header not checked as C++"; fi

check: c-tests
	@set -e; for t in $(HOST_TESTS); do echo "== $$t"; $$t; done

# Migrates 256 MiB from a source to a destination process over Soft-RoCE in a
# throw-away QEMU guest (scripts/rxe-vm.sh; needs root, boots in ~10 s).
# scripts/demo.sh first installs what is missing on Debian/Ubuntu
# (scripts/prerequisites.sh), then builds (all, the demo) and boots the guest.
demo:
	bash scripts/demo.sh

# librdmamig0, librdmamig-dev and rdmamig (debian/) with dpkg-buildpackage -b
# -us -uc, into target/deb/; needs debhelper (scripts/prerequisites.sh deb).
deb:
	bash scripts/deb.sh

# The migration benchmark: ib_write_bw anchors, QEMU -> QEMU and rdmamig <->
# rdmamig (dense guest in four modes, sparse guest, final round) in one guest
# boot; prints one table (docs/benchmarks.md). Needs root; RXE_VM_MEM 6G.
BENCH_ARGS ?=
bench:
	bash scripts/bench.sh $(BENCH_ARGS)

# The post-copy benchmark: fault service latency (1 and 4 vCPU threads) and
# the background pull (dense, sparse) against ib_read_lat / ib_read_bw in one
# guest boot (examples/postcopy_bench.rs, scripts/postcopy-bench.sh;
# docs/benchmarks.md). Needs root; RXE_VM_MEM 3G. Options: BENCH_POSTCOPY_ARGS.
BENCH_POSTCOPY_ARGS ?=
bench-postcopy:
	bash scripts/postcopy-bench.sh $(BENCH_POSTCOPY_ARGS)

# QEMU 10.2 on librdmamig against stock QEMU 10.2 over rdma and TCP: a
# running Linux guest, three guest boots, the median (scripts/bench-qemu.sh,
# integrations/qemu/README.md). Needs root; builds QEMU once if not cached.
bench-qemu: all
	bash scripts/bench-qemu.sh

# Post-copy in QEMU 10.2, patched over rdma against stock over TCP (preempt
# off and on): the guest's first-touch latency, QEMU's blocktime and fault
# latency, the phase's time, ib_read_lat in the same boot; three guest
# boots, the median (scripts/bench-qemu-postcopy.sh, docs/benchmarks.md).
bench-qemu-postcopy: all
	bash scripts/bench-qemu-postcopy.sh

# The C demo's throughput: built -O2 without sanitizers, and perftest's
# ib_write_bw (1 MiB, tx depth 16) as the anchor, in the same guest boot.
BENCH_DEMO := $(TARGET_DIR)/bench/rdma_demo
bench-demo: all $(BENCH_DEMO)
	bash scripts/bench-anchor.sh '$(BENCH_DEMO) --mib 512 && $(BENCH_DEMO) --mib 512 --pin-all'

# The time close and the final iteration spend deregistering, with the
# unregistration worker and without: a 1 GiB guest per side in a 4G guest,
# three boots, medians (scripts/bench-unregister.sh; BENCH_BOOTS, RXE_VM_MEM).
bench-unregister:
	bash scripts/bench-unregister.sh --mib 1024

# Registration at the kernel's rate: pin-all against a bare ibv_reg_mr loop
# over the same memory, populated and fresh, one thread and every CPU; three
# boots, medians (scripts/bench-registration.sh; BENCH_BOOTS, RXE_VM_MEM;
# docs/benchmarks.md). Needs root.
bench-registration:
	bash scripts/bench-registration.sh --mib 1024

# The native benchmark: both sides' CPU path per core beside a plain memory
# read and a bitmap popcount, and the tables of 1, 2 and 4 TiB guests (time,
# the library's heap); medians of three runs, docs/native-*.svg
# (docs/benchmarks.md, "Native CPU cost and scale"). Host only.
bench-native:
	python3 scripts/bench-native.py $(BENCH_NATIVE_ARGS)

$(BENCH_DEMO): capi/c-tests/rdma_test_demo.c capi/include/rdmamig.h $(SHLIB) $(LIBOUT)/librdmamig.so Makefile
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -Icapi/include -o $@ $< -L$(LIBOUT) -Wl,-rpath,'$$ORIGIN/../lib' -lrdmamig -lpthread

# What the C side generates (the counters of rdmamig_stats and
# rdmamig_postcopy_progress, rdmamig_status and rdmamig_log_level from the
# library's lists of them, docs/design.md; the thread-safety list of
# rdmamig_conn from the functions' signatures), then the header from it.
generate:
	RDMAMIG_REGENERATE=1 $(CARGO) test --release -p rdmamig-capi --lib -- generated_
	$(MAKE) header

header:
	$(CBINDGEN) --config capi/cbindgen.toml --output capi/include/rdmamig.h capi/src/lib.rs

symbols: all
	bash scripts/check-abi.sh --list $(SHLIB) > capi/abi/symbols.txt
	@echo "capi/abi/symbols.txt: $$(wc -l < capi/abi/symbols.txt) symbols"
	bash scripts/check-abi.sh --values > capi/abi/values.txt
	@echo "capi/abi/values.txt: $$(wc -l < capi/abi/values.txt) values"

check-abi: all
	bash scripts/check-abi.sh $(SHLIB)

# The C API reference from the header's doc comments: HTML (docs/Doxyfile)
# and the man(3) pages (docs/Doxyfile.man); `make man` only the latter.
docs:
	bash scripts/docs.sh

man:
	bash scripts/docs.sh --man

clean:
	rm -rf $(LIBOUT) $(CTEST_DIR) $(VG_CTEST_DIR) $(TARGET_DIR)/rdmamig.pc

FORCE:
