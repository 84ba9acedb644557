#!/usr/bin/env bats
# Start-up cost of image runs: FFmpeg is loaded only when a video is opened
# (lib/media_video.c), so mcv-run does not list it as a needed library, and
# without a loadable FFmpeg video input fails with one clear line while
# images still work.

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	RUN=${BIN:-bin}/mcv-run
	[ -x "$RUN" ] || skip "no $RUN (build first)"
	M=examples/models/proving-text.gguf
	P=examples/models/proving-mmproj.gguf
	IMG=examples/images/receipt-1.png
}

@test "mcv-run does not need FFmpeg's libraries at start-up" {
	command -v readelf >/dev/null || skip "no readelf"
	run readelf -d "$RUN"
	[ "$status" -eq 0 ]
	[[ "$output" == *NEEDED* ]]
	[[ "$output" != *libavformat* ]]
	[[ "$output" != *libavcodec* ]]
	[[ "$output" != *libswscale* ]]
}

@test "an FFmpeg that cannot be loaded: video is a one-line error (exit 1), an image still runs" {
	[ -s "$M" ] && [ -s "$P" ] || skip "no proving model"
	so=$(ldconfig -p | sed -n 's/^[[:space:]]*\(libavutil\.so\.[0-9]*\) .*/\1/p' | head -n 1)
	[ -n "$so" ] || skip "no libavutil in the loader cache"
	mkdir -p "$BATS_TEST_TMPDIR/fake"
	: > "$BATS_TEST_TMPDIR/fake/$so"
	run env LD_LIBRARY_PATH="$BATS_TEST_TMPDIR/fake" "$RUN" -m "$M" --mmproj "$P" -t 1 -n 2 -p "What happens?" \
		--video test/fixtures/media/tiny.mp4
	[ "$status" -eq 1 ]
	[ "${#lines[@]}" -eq 1 ]
	[[ "$output" == "mcv-run: test/fixtures/media/tiny.mp4: video input needs FFmpeg ($so)"* ]]
	run env LD_LIBRARY_PATH="$BATS_TEST_TMPDIR/fake" "$RUN" -m "$M" --mmproj "$P" -t 1 -n 2 -p "Read the receipt." \
		-i "$IMG"
	[ "$status" -eq 0 ]
	[ -n "$output" ]
}
