#!/usr/bin/env bats
# mcv-run's media inputs: -i (PNG, JPEG, several), --video, batches from
# files, directories, archives (file and stdin) and path lists (lines, -0);
# JSON records, error records for every kind of bad input, the batch going
# on, the final exit status, no signal.  The model is a random tiny
# text + mmproj pair from scripts/ref/export.py --random, made once here.
# The tests of bad input run an ASan+UBSan build of mcv-run when the
# sanitizer library is at hand (make check builds it).

PY=/usr/bin/python3

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	export RUN="${BIN:-bin}/mcv-run"
	export D="$BATS_FILE_TMPDIR/m" F="$BATS_FILE_TMPDIR/f"
	export OMP_NUM_THREADS=1 SAN="${BIN:-bin}/mcv-run"
	local b=${B:-build}
	if [ -f "$b/libmcv-san.a" ] && ${CC:-cc} -std=c11 -D_GNU_SOURCE -Ilib -Iquant -Ipack -Icmd \
		-DMCV_DATADIR='"/nonexistent"' -g -O1 -march=native -fopenmp \
		-fsanitize=address,undefined -fno-sanitize-recover=undefined \
		-o "$BATS_FILE_TMPDIR/mcv-run-san" cmd/mcv-run.c cmd/batch.c cmd/cli.c "$b/libmcv-san.a" \
		$(pkg-config --libs libpng libjpeg libavformat libavcodec libswscale libavutil libarchive) \
		-lm -ldl -lpthread 2>/dev/null; then
		export SAN="$BATS_FILE_TMPDIR/mcv-run-san" ASAN_OPTIONS=detect_leaks=1
	fi
	$PY -c 'import torch, PIL' 2>/dev/null || return 0
	mkdir -p "$D" "$F"
	$PY scripts/ref/export.py --random --out-dir "$D" >/dev/null 2>&1 || rm -f "$D"/*.gguf
	$PY - "$F" <<'PYEOF'
import sys, os, io, tarfile, struct, zlib
from PIL import Image
d = sys.argv[1]
W, H = 60, 44
im = Image.new('RGB', (W, H))
im.putdata([((x * 37 + y * 11) % 256, (x * 5 + y * 23) % 256, (x ^ y) * 9 % 256)
            for y in range(H) for x in range(W)])
im.save(f'{d}/good.png')
im.save(f'{d}/good.jpg', quality=90)
im.resize((44, 60)).save(f'{d}/tall.png')
png = open(f'{d}/good.png', 'rb').read()
jpg = open(f'{d}/good.jpg', 'rb').read()
open(f'{d}/trunc.png', 'wb').write(png[:len(png) // 2])
open(f'{d}/trunc.jpg', 'wb').write(jpg[:len(jpg) // 2])
open(f'{d}/zero.png', 'wb').close()
open(f'{d}/zero.jpg', 'wb').close()
c = bytearray(png); c[60] ^= 0x10; open(f'{d}/corrupt.png', 'wb').write(c)
c = bytearray(jpg); i = c.find(b'\xff\xc0'); c[i + 5:i + 9] = b'\0\0\0\0'
open(f'{d}/corrupt.jpg', 'wb').write(c)  # a frame header of 0 x 0 pixels
open(f'{d}/noise.bin', 'wb').write(os.urandom(300000))
open(f'{d}/notes.txt', 'w').write('not an image\n')
# a PNG whose header claims 100000 x 100000 (CRC fixed): a decompression bomb
b = bytearray(png); b[16:24] = struct.pack('>II', 100000, 100000)
b[29:33] = struct.pack('>I', zlib.crc32(bytes(b[12:29])))
open(f'{d}/bomb.png', 'wb').write(b)
# a tar with traversal names, a control character in a name, invalid
# UTF-8, and a member whose header claims 8 GiB
def member(name, data, size=None):
    ti = tarfile.TarInfo(name); ti.size = len(data)
    h = bytearray(ti.tobuf(format=tarfile.USTAR_FORMAT, encoding='latin-1'))
    if size is not None:
        h[124:136] = b'%011o\0' % size
        h[148:156] = b' ' * 8
        h[148:156] = b'%06o\0 ' % sum(h)
    return bytes(h) + data + b'\0' * (-len(data) % 512)
out = member('../../etc/evil.png', png) + member('/abs/ok.jpg', jpg)
out += member('tab\tname\xff.txt', b'hi\n') + member('huge.png', png, size=0o77777777777)
open(f'{d}/hostile.tar', 'wb').write(out + b'\0' * 1024)
os.makedirs(f'{d}/dir/sub.png', exist_ok=True)
for n, data in (('b.png', png), ('a.JPG', jpg), ('.hidden.png', png), ('readme.txt', b'x')):
    open(f'{d}/dir/{n}', 'wb').write(data)
os.makedirs(f'{d}/odd', exist_ok=True)
open(f'{d}/odd/new\nline.png', 'wb').write(png)
PYEOF
	(cd "$F" && bsdtar -cf a.tar good.png notes.txt good.jpg)
	bsdtar -czf "$F/a.tar.gz" @"$F/a.tar"
	(cd "$F" && bsdtar -czf long.tar.gz good.png noise.bin good.jpg)
	bsdtar --format zip -cf "$F/a.zip" @"$F/a.tar"
	head -c $(($(wc -c <"$F/long.tar.gz") * 2 / 3)) "$F/long.tar.gz" >"$F/cut.tar.gz"
	yes "not a video" | head -c 3000 >"$F/bad.mp4"
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$RUN" ] || skip "no $RUN (build first)"
	$PY -c 'import torch, PIL' 2>/dev/null || skip "/usr/bin/python3 lacks torch or PIL"
	[ -s "$D/proving-text.gguf" ] && [ -s "$D/proving-mmproj.gguf" ] ||
		skip "export.py --random did not make a model pair"
	T=$BATS_TEST_TMPDIR
	M="-m $D/proving-text.gguf -n 3 --temp 0 -q"
}

# mm ARGS...: run mcv-run; $status, $out (stdout), $err (stderr).  Fails on
# a signal or a crash exit (> 2), a sanitizer report, and when stdout is not
# valid JSON lines (unless --text is among the arguments).
# san ARGS...: the same with the sanitizer build (when there is one).
mm() {
	"${EXE:-$RUN}" "$@" >"$T/out" 2>"$T/err" && status=0 || status=$?
	out=$(cat "$T/out")
	err=$(cat "$T/err")
	if [ "$status" -gt 2 ]; then echo "exit $status: $err"; return 1; fi
	if grep -q 'Sanitizer\|runtime error' "$T/err"; then cat "$T/err"; return 1; fi
	case " $* " in *" --text "*) return 0 ;; esac
	$PY -c 'import json, sys
for l in open(sys.argv[1], encoding="utf-8"):
    r = json.loads(l)
    assert "source" in r and "member" in r, l
    assert ("error" in r) != ("text" in r), l' "$T/out" || { echo "bad JSON lines:"; cat "$T/out"; return 1; }
}

san() { EXE=$SAN mm "$@"; }

# field N KEY: KEY of the N-th record (1-based), as Python prints it
field() {
	$PY -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[int(sys.argv[2]) - 1])
print(r.get(sys.argv[3]))' "$T/out" "$1" "$2"
}

nlines() { printf '%s\n' "$out" | grep -c . || true; }

@test "-i PNG and -i JPEG: one record with text, prompt and token counts" {
	for f in good.png good.jpg; do
		mm $M --jsonl -p "Describe the image." -i "$F/$f"
		echo "$out"
		[ "$status" -eq 0 ]
		[ "$(nlines)" -eq 1 ]
		[ "$(field 1 source)" = "$F/$f" ]
		[ "$(field 1 member)" = None ]
		[ "$(field 1 prompt)" = "Describe the image." ]
		[ "$(field 1 prompt_tokens)" -gt 20 ]
		t=$(field 1 tokens); [ "$t" -ge 0 ] && [ "$t" -le 3 ]
		[ "$(field 1 ms)" -ge 0 ]
	done
	# without --jsonl the answer is plain text, the same as the record's
	mm $M --jsonl -p hi -i "$F/good.png"
	want=$(field 1 text)
	"$RUN" $M -p hi -i "$F/good.png" >"$T/plain"
	[ "$(cat "$T/plain")" = "$want" ]
}

@test "multi -i: two images make a longer prompt than one, in either order" {
	mm $M --jsonl -p hi -i "$F/good.png"
	one=$(field 1 prompt_tokens)
	mm $M --jsonl -p hi -i "$F/good.png" -i "$F/tall.png"
	[ "$status" -eq 0 ]
	two=$(field 1 prompt_tokens)
	mm $M --jsonl -p hi -i "$F/tall.png" -i "$F/good.png"
	[ "$(field 1 prompt_tokens)" -eq "$two" ]
	echo "one $one two $two"
	[ "$two" -gt $((one + 10)) ]
	# a bad image in a prompt fails the whole prompt: exit 1, one error
	mm $M --jsonl -p hi -i "$F/good.png" -i "$F/trunc.png"
	[ "$status" -eq 1 ]
	[ "$(field 1 source)" = "$F/trunc.png" ]
	[ -n "$(field 1 error)" ]
}

@test "--video: frames in the prompt; more frames, more prompt tokens" {
	mm $M --jsonl -p "What happens?" --video test/fixtures/media/tiny.mp4 --frames 2
	echo "$out"
	[ "$status" -eq 0 ]
	two=$(field 1 prompt_tokens)
	mm $M --jsonl -p "What happens?" --video test/fixtures/media/tiny.mp4 --frames 4
	[ "$status" -eq 0 ]
	four=$(field 1 prompt_tokens)
	[ "$four" -gt "$two" ]
	mm $M --jsonl -p "What happens?" --video test/fixtures/media/tiny.mp4 --fps 1
	[ "$status" -eq 0 ]
}

@test "unreadable video: garbage, zero bytes, missing file give a clear error, exit 1" {
	: >"$T/zero.mp4"
	for v in "$F/bad.mp4" "$T/zero.mp4" "$F/missing.mp4"; do
		san $M -p hi --video "$v" --frames 2
		echo "$v: $err"
		[ "$status" -eq 1 ]
		[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]
		[[ "$err" == "mcv-run: $v: "* ]]
		san $M --jsonl -p hi --video "$v" --frames 2
		[ "$status" -eq 1 ]
		[ -n "$(field 1 error)" ]
	done
}

@test "--archive tar, tar.gz, zip from a file and from stdin: images captioned, text member an error" {
	for a in a.tar a.tar.gz a.zip; do
		for how in file stdin; do
			if [ $how = file ]; then
				mm $M -p hi --archive "$F/$a"; src="$F/$a"
			else
				mm $M -p hi --archive - <"$F/$a"; src=-
			fi
			echo "$a $how: $out"
			[ "$status" -eq 1 ]
			[ "$(nlines)" -eq 3 ]
			[ "$(field 1 source)" = "$src" ]
			[ "$(field 1 member)" = good.png ]
			[ "$(field 1 prompt_tokens)" -gt 20 ]
			[ "$(field 2 member)" = notes.txt ]
			[[ "$(field 2 error)" == *"not an image"* ]]
			[ "$(field 3 member)" = good.jpg ]
			[ "$(field 3 error)" = None ]
		done
	done
}

@test "damaged archive: the members before the damage, then an error record" {
	san $M -p hi --archive "$F/cut.tar.gz"
	echo "$out"
	[ "$status" -eq 1 ]
	[ "$(field 1 member)" = good.png ]
	printf '%s\n' "$out" | tail -n 1 | grep -q '"error":'
	san $M -p hi --archive "$F/good.png"
	[ "$status" -eq 1 ]
	[ "$(nlines)" -eq 1 ]
	[ "$(field 1 member)" = None ]
	[ -n "$(field 1 error)" ]
}

@test "hostile archive: traversal names as stored, huge declared size refused, odd names valid JSON" {
	san $M -p hi --archive "$F/hostile.tar"
	echo "$out"
	[ "$status" -eq 1 ]
	[ "$(field 1 member)" = ../../etc/evil.png ]
	[ "$(field 1 error)" = None ]
	[ "$(field 2 member)" = /abs/ok.jpg ]
	[ "$(field 2 error)" = None ]
	[ -n "$(field 3 error)" ]
	printf '%s\n' "$out" | sed -n 3p | grep -q '"member":"tab\\tname\\ufffd.txt"'
	[ "$(field 4 member)" = huge.png ]
	[[ "$(field 4 error)" == *"over --max-bytes"* ]]
	[ ! -e /etc/evil.png ] && [ ! -e /abs/ok.jpg ]
}

@test "damaged images: corrupt, truncated, zero-byte PNG and JPEG are error records, the batch goes on" {
	san $M -p hi "$F/good.png" "$F/corrupt.png" "$F/trunc.png" "$F/zero.png" \
		"$F/corrupt.jpg" "$F/trunc.jpg" "$F/zero.jpg" "$F/notes.txt" "$F/good.jpg"
	echo "$out"
	[ "$status" -eq 1 ]
	[ "$(nlines)" -eq 9 ]
	[ "$(field 1 error)" = None ]
	for i in 2 3 4 5 6 7 8; do
		[ -n "$(field $i error)" ] && [ "$(field $i error)" != None ]
	done
	[[ "$(field 4 error)" == *"0 bytes"* ]]
	[ "$(field 9 source)" = "$F/good.jpg" ]
	[ "$(field 9 error)" = None ]
	# all good: exit 0
	san $M -p hi "$F/good.png" "$F/good.jpg"
	[ "$status" -eq 0 ]
}

@test "--max-pixels refuses a bomb and a big image as error records" {
	san $M -p hi "$F/bomb.png" "$F/good.png"
	echo "$out"
	[ "$status" -eq 1 ]
	[[ "$(field 1 error)" == *"--max-pixels"* ]]
	[ "$(field 2 error)" = None ]
	san $M -p hi --max-pixels 1K "$F/good.png"
	[ "$status" -eq 1 ]
	[[ "$(field 1 error)" == *"--max-pixels"* ]]
}

@test "a directory: its image files by name, sorted; others passed over" {
	mm $M -p hi "$F/dir"
	echo "$out"
	[ "$status" -eq 0 ]
	[ "$(nlines)" -eq 2 ]
	[ "$(field 1 source)" = "$F/dir/a.JPG" ]
	[ "$(field 2 source)" = "$F/dir/b.png" ]
}

@test "paths on stdin: --batch one per line, -0 NUL-separated (a newline in a name)" {
	printf '%s\n' "$F/good.png" "" "$F/zero.png" "$F/missing.png" "$F/dir" >"$T/list"
	mm $M -p hi --batch <"$T/list"
	echo "$out"
	[ "$status" -eq 1 ]
	[ "$(nlines)" -eq 5 ]
	[ "$(field 1 source)" = "$F/good.png" ]
	[[ "$(field 2 error)" == *"0 bytes"* ]]
	[[ "$(field 3 error)" == *"No such file"* ]]
	[ "$(field 5 source)" = "$F/dir/b.png" ]
	printf '%s\0' "$F/odd/new
line.png" "$F/good.jpg" >"$T/list0"
	mm $M -p hi -0 <"$T/list0"
	echo "$out"
	[ "$status" -eq 0 ]
	[ "$(nlines)" -eq 2 ]
	printf '%s\n' "$out" | head -n 1 | grep -q 'new\\nline.png'
	[ "$(field 1 error)" = None ]
}

@test "--text: SOURCE TAB MEMBER TAB TEXT lines, failures on stderr" {
	mm $M --text -p hi --archive "$F/a.tar"
	echo "$out"; echo "$err"
	[ "$status" -eq 1 ]
	[ "$(nlines)" -eq 2 ]
	[ "$(printf '%s\n' "$out" | cut -f 1,2 | head -n 1)" = "$F/a.tar	good.png" ]
	[ "$(printf '%s\n' "$out" | awk -F '\t' '{ print NF }' | sort -u)" = 3 ]
	[[ "$err" == *"notes.txt: not an image"* ]]
}

@test "usage errors exit 2 with one line" {
	for args in "-p hi -i $F/good.png $F/good.jpg" "-p hi --batch --archive -" \
		"$F/good.png" "-p hi --compress 8x -i $F/good.png" "-p hi --max-pixels lots $F/good.png" \
		"-p hi --upscale 9 $F/good.png" "-p hi --upscale x $F/good.png" \
		"-p hi --frames 2 --fps 1 --video x.mp4" "--tokens 1,2 -i $F/good.png" \
		"-p hi $F/missing.png"; do
		mm $M $args </dev/null
		echo "$args: $status $err"
		[ "$status" -eq 2 ]
		[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]
		[[ "$err" == "mcv-run: "* ]]
	done
}

@test "a missing or broken mmproj is one error line, exit 1" {
	san -m "$D/proving-text.gguf" --mmproj "$F/missing.gguf" -p hi "$F/good.png"
	[ "$status" -eq 1 ]
	[[ "$err" == "mcv-run: "* ]] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]
	san -m "$D/proving-text.gguf" --mmproj "$F/good.png" -p hi "$F/good.png"
	[ "$status" -eq 1 ]
	[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]
	# the default mmproj of a model named X-text.gguf is X-mmproj.gguf beside it
	cp "$D/proving-text.gguf" "$T/alone-text.gguf"
	mm -m "$T/alone-text.gguf" -p hi "$F/good.png"
	[ "$status" -eq 1 ]
	[[ "$err" == *"alone-mmproj.gguf"* ]]
}

@test "example pipelines: caption an archive, OCR a folder, receipt totals as CSV" {
	export MCV_RUN="$RUN" MCV_RUN_OPTS="$M"
	sh examples/pipelines/caption-archive.sh "$F/dir" "$T/captions.jsonl" 2>"$T/err"
	[ "$(wc -l <"$T/captions.jsonl")" -eq 2 ]
	$PY -c 'import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["member"] for r in rs] == ["a.JPG", "b.png"] and all("text" in r for r in rs), rs' "$T/captions.jsonl"
	sh examples/pipelines/ocr-folder.sh "$F/dir" "$T/ocr.jsonl" 2>"$T/err"
	[ "$(wc -l <"$T/ocr.jsonl")" -eq 1 ]
	grep -q '"source":".*/dir/b.png"' "$T/ocr.jsonl"
	sh examples/pipelines/receipts-to-csv.sh "$F/dir" "$T/totals.csv" 2>"$T/err"
	[ "$(head -n 1 "$T/totals.csv")" = "file,total" ]
	[ "$(wc -l <"$T/totals.csv")" -eq 2 ]
	sed -n 2p "$T/totals.csv" | grep -q '^"b.png",[0-9.]*$'
	# a failing input shows in the exit status
	cp "$F/trunc.png" "$T/bad.png"
	run sh examples/pipelines/receipts-to-csv.sh "$T" "$T/t2.csv"
	[ "$status" -eq 1 ]
}
