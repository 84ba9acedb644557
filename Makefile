# mcv: one Makefile for the library, every tool, man pages and tests.
#   make                 libmcv.a and every tool in bin/
#   make check           install missing dependencies, build, run all tests
#   make install PREFIX=/usr/local DESTDIR=
#   make bench-kernels   block-format kernels against ggml (scripts/bench/)
#   make demo            caption examples/images/ from a tar archive (default model)
# New sources are picked up by wildcard: lib/*.c quant/*.c pack/*.c go into
# libmcv.a, cmd/mcv-*.c are tools (other cmd/*.c are shared front-end code),
# test/unit/test_*.c are unit tests, test/*.bats are tool contract tests.

PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
MANDIR  ?= $(PREFIX)/share/man
DATADIR ?= $(PREFIX)/share/mcv
CC      ?= cc
# Build and output folders; parallel workers may use their own (make B=/tmp/x BIN=/tmp/x/bin).
B       ?= build
BIN     ?= bin
OPT     ?= -O2
ARCH    ?= -march=native
PKGS     = libpng libjpeg libavformat libavcodec libswscale libavutil libarchive

# pkg-config is evaluated lazily (=) so `make check` can install it first.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS))
PKG_LIBS   = $(shell pkg-config --libs $(PKGS))
CPPFLAGS  += -D_GNU_SOURCE -Ilib -Iquant -Ipack -Icmd -DMCV_DATADIR='"$(DATADIR)"'
CFLAGS    += -std=c11 -Wall -Wextra -g $(OPT) $(ARCH) -fopenmp
# --as-needed: FFmpeg is linked (the build checks it) but loaded only when a
# video is opened (lib/media_video.c dlopens it), not by every image run.
LDLIBS    += -Wl,--as-needed $(PKG_LIBS) -fopenmp -lm -ldl -lpthread

LIB_SRC  = $(sort $(wildcard lib/*.c quant/*.c pack/*.c))
CLI_SRC  = $(filter-out cmd/mcv-%.c,$(wildcard cmd/*.c))
TOOL_SRC = $(wildcard cmd/mcv-*.c)
TOOLS    = $(patsubst cmd/%.c,$(BIN)/%,$(TOOL_SRC))
UNIT_SRC = $(wildcard test/unit/test_*.c)
UNITS    = $(patsubst test/unit/%.c,$(B)/test/%,$(UNIT_SRC))
HELPERS_SRC = $(wildcard scripts/*.c scripts/bench/*.c)
HELPERS  = $(patsubst %.c,$(B)/%,$(notdir $(HELPERS_SRC)))
MAN1     = $(wildcard man/*.1)
MAN7     = $(wildcard man/*.7)

# Unit tests also built with ASan/UBSan and run in `make check` (hostile input).
SAN_TESTS ?= $(patsubst test/unit/%.c,%,$(wildcard test/unit/test_gguf*.c test/unit/test_media*.c test/unit/test_pack*.c test/unit/test_safetensors*.c test/unit/test_vision*.c))
SAN_FLAGS  = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

LIB_OBJ  = $(patsubst %.c,$(B)/obj/%.o,$(LIB_SRC))
CLI_OBJ  = $(patsubst %.c,$(B)/obj/%.o,$(CLI_SRC))
SAN_OBJ  = $(patsubst %.c,$(B)/san/%.o,$(LIB_SRC))

all: $(B)/libmcv.a $(TOOLS) $(HELPERS)

$(B)/obj/%.o: %.c $(wildcard lib/*.h quant/*.h pack/*.h cmd/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(PKG_CFLAGS) $(CFLAGS) -c -o $@ $<

$(B)/san/%.o: %.c $(wildcard lib/*.h quant/*.h pack/*.h cmd/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(PKG_CFLAGS) $(CFLAGS) -O1 $(SAN_FLAGS) -c -o $@ $<

$(B)/libmcv.a: $(LIB_OBJ)
	@mkdir -p $(B)
	rm -f $@
	ar rcs $@ $^

$(B)/libmcv-san.a: $(SAN_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BIN)/%: $(B)/obj/cmd/%.o $(CLI_OBJ) $(B)/libmcv.a
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -o $@ $< $(CLI_OBJ) $(B)/libmcv.a $(LDLIBS)

$(B)/test/%: test/unit/%.c test/unit/unit.h $(B)/libmcv.a
	@mkdir -p $(B)/test
	$(CC) $(CPPFLAGS) -Itest/unit $(PKG_CFLAGS) $(CFLAGS) -o $@ $< $(B)/libmcv.a $(LDLIBS)

$(B)/test-san/%: test/unit/%.c test/unit/unit.h $(B)/libmcv-san.a
	@mkdir -p $(B)/test-san
	$(CC) $(CPPFLAGS) -Itest/unit $(PKG_CFLAGS) $(CFLAGS) -O1 $(SAN_FLAGS) -o $@ $< $(B)/libmcv-san.a $(LDLIBS)

# Helper programs (model generator, benchmarks) live in scripts/ and link libmcv.
$(B)/%: scripts/%.c $(B)/libmcv.a
	$(CC) $(CPPFLAGS) $(PKG_CFLAGS) $(CFLAGS) -o $@ $< $(B)/libmcv.a $(LDLIBS)
$(B)/%: scripts/bench/%.c $(B)/libmcv.a
	$(CC) $(CPPFLAGS) $(PKG_CFLAGS) $(CFLAGS) -o $@ $< $(B)/libmcv.a $(LDLIBS)

setup:
	@scripts/setup.sh

# `make check` first installs what is missing, then re-enters make so that
# pkg-config and the compiler are found by a fresh parse.
check: setup
	@$(MAKE) --no-print-directory check-run

check-run: all $(UNITS) $(patsubst %,$(B)/test-san/%,$(SAN_TESTS))
	@B=$(B) BIN=$(BIN) SAN_TESTS="$(SAN_TESTS)" sh test/run.sh

# The default model's files are looked up through MCV_DATADIR so the demo
# works with any BIN folder.
demo: setup
	@$(MAKE) --no-print-directory all
	@if [ ! -s examples/models/proving-text.gguf ] || [ ! -s examples/models/proving-mmproj.gguf ]; then \
		echo "make demo: the default model is absent: examples/models/proving-text.gguf and" \
		     "proving-mmproj.gguf are needed (see examples/models/README.md)" >&2; exit 1; fi
	MCV_RUN=$(BIN)/mcv-run MCV_DATADIR=$(CURDIR)/examples \
		sh examples/pipelines/caption-archive.sh examples/images $(B)/captions.jsonl
	@cat $(B)/captions.jsonl

bench-kernels: all
	./$(B)/bench-kernels

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man7 $(DESTDIR)$(DATADIR)/models
	$(if $(TOOLS),install -m 755 $(TOOLS) $(DESTDIR)$(BINDIR)/)
	$(if $(MAN1),install -m 644 $(MAN1) $(DESTDIR)$(MANDIR)/man1/)
	$(if $(MAN7),install -m 644 $(MAN7) $(DESTDIR)$(MANDIR)/man7/)
	$(if $(wildcard examples/models/*.gguf),install -m 644 $(wildcard examples/models/*.gguf) $(DESTDIR)$(DATADIR)/models/)

clean:
	rm -rf $(B) $(BIN)

.PHONY: all setup check check-run install clean bench-kernels demo
.SECONDARY:
