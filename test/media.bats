#!/usr/bin/env bats
# The media layer end to end (lib/media.h through scripts/media-probe.c):
# images made by PIL, archives made by bsdtar and by hand (lying headers,
# traversal names), the committed tiny video; corrupt, truncated, zero-byte
# and hostile inputs each give an error line, the run goes on, nothing is
# printed on stderr, no signal.

PY=/usr/bin/python3

setup_file() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	local b=${B:-build}
	export PROBE="$b/media-probe"
	export F="$BATS_FILE_TMPDIR/f"
	[ -x "$PROBE" ] || return 0
	# With the sanitizer build of libmcv at hand (make check makes it), run
	# every case below under ASan+UBSan: any report lands on stderr, which
	# each test requires to be empty.
	if [ -f "$b/libmcv-san.a" ] && ${CC:-cc} -std=c11 -D_GNU_SOURCE -Ilib -g -O1 \
		-fsanitize=address,undefined -fno-sanitize-recover=undefined -fopenmp \
		-o "$BATS_FILE_TMPDIR/media-probe-san" scripts/media-probe.c "$b/libmcv-san.a" \
		$(pkg-config --libs libpng libjpeg libavformat libavcodec libswscale libavutil libarchive) \
		-lm 2>/dev/null; then
		export PROBE="$BATS_FILE_TMPDIR/media-probe-san" ASAN_OPTIONS=detect_leaks=1
	fi
	$PY -c 'import PIL' 2>/dev/null || return 0
	mkdir -p "$F"
	$PY - "$F" <<'EOF'
import sys, os, io, tarfile, struct
from PIL import Image
d = sys.argv[1]
W, H = 41, 27
rgb = Image.new('RGB', (W, H))
rgb.putdata([((x * 37 + y * 11) % 256, (x * 5 + y * 23) % 256, (x ^ y) * 9 % 256)
             for y in range(H) for x in range(W)])
rgb.save(f'{d}/rgb.png')
rgb.convert('L').save(f'{d}/grey.png')
rgb.convert('P', palette=Image.ADAPTIVE, colors=16).save(f'{d}/palette.png')
a = rgb.copy(); a.putalpha(128); a.save(f'{d}/rgba.png')
Image.new('I;16', (W, H), 40000).save(f'{d}/grey16.png')
smooth = Image.linear_gradient('L').resize((64, 48)).convert('RGB')
smooth.save(f'{d}/base.jpg', quality=95)
smooth.save(f'{d}/prog.jpg', quality=95, progressive=True)
smooth.convert('L').save(f'{d}/grey.jpg', quality=95)
rgb.resize((80, 56)).save(f'{d}/s444.jpg', quality=80, subsampling=0)
smooth.convert('CMYK').save(f'{d}/cmyk.jpg', quality=95)
ex = Image.Exif(); ex[0x0112] = 6
smooth.save(f'{d}/rot6.jpg', quality=95, exif=ex.tobytes())
for o in range(1, 9):
    ex[0x0112] = o
    rgb.save(f'{d}/orient{o}.jpg', quality=90, exif=ex.tobytes())
# damaged copies
png = open(f'{d}/rgb.png', 'rb').read()
jpg = open(f'{d}/prog.jpg', 'rb').read()
open(f'{d}/trunc.png', 'wb').write(png[:len(png) // 2])
open(f'{d}/trunc.jpg', 'wb').write(jpg[:len(jpg) // 2])
open(f'{d}/zero.png', 'wb').close()
open(f'{d}/zero.jpg', 'wb').close()
open(f'{d}/text.png', 'w').write('not an image at all\n')
c = bytearray(png); c[60] ^= 0x10; open(f'{d}/corrupt.png', 'wb').write(c)
# a PNG whose IHDR claims 100000x100000 (CRC fixed up): a bomb
import zlib
b = bytearray(png); b[16:24] = struct.pack('>II', 100000, 100000)
b[29:33] = struct.pack('>I', zlib.crc32(bytes(b[12:29])))
open(f'{d}/bomb.png', 'wb').write(b)
# archive content
os.makedirs(f'{d}/tree/sub', exist_ok=True)
for n in ('rgb.png', 'prog.jpg'):
    open(f'{d}/tree/{n}', 'wb').write(open(f'{d}/{n}', 'rb').read())
open(f'{d}/tree/sub/grey.jpg', 'wb').write(open(f'{d}/grey.jpg', 'rb').read())
open(f'{d}/tree/notes.txt', 'w').write('hello\n')
# a tar with traversal names and a member that lies about its size
def member(name, data, size=None):
    ti = tarfile.TarInfo(name); ti.size = len(data)
    h = bytearray(ti.tobuf(format=tarfile.USTAR_FORMAT))
    if size is not None:
        h[124:136] = b'%011o\0' % size
        h[148:156] = b' ' * 8
        h[148:156] = b'%06o\0 ' % sum(h)
    return bytes(h) + data + b'\0' * (-len(data) % 512)
out = member('../../etc/evil.png', png) + member('/abs/ok.jpg', jpg)
out += member('notes.txt', b'hi\n') + member('huge.png', png, size=0o77777777777)
open(f'{d}/hostile.tar', 'wb').write(out)
out = member('first.png', png) + member('short.png', png, size=len(png) + 5000)
open(f'{d}/short.tar', 'wb').write(out)
EOF
	(cd "$F/tree" && bsdtar -cf ../a.tar rgb.png sub notes.txt prog.jpg)
	bsdtar -czf "$F/a.tar.gz" @"$F/a.tar"
	bsdtar --zstd -cf "$F/a.tar.zst" @"$F/a.tar" 2>/dev/null || true
	bsdtar --format zip -cf "$F/a.zip" @"$F/a.tar"
	bsdtar --format 7zip -cf "$F/a.7z" @"$F/a.tar"
	bsdtar --format newc -cf "$F/a.cpio" @"$F/a.tar"
	head -c $(($(wc -c <"$F/a.tar.gz") / 2)) "$F/a.tar.gz" >"$F/cut.tar.gz"
}

setup() {
	cd "$BATS_TEST_DIRNAME/.." || return 1
	[ -x "$PROBE" ] || skip "no $PROBE (build first)"
	[ -d "$F" ] || skip "fixtures need /usr/bin/python3 with PIL"
	T=$BATS_TEST_TMPDIR
}

# probe ARGS...: runs the probe; $status, $out (stdout), stderr must be empty
# and the exit must be 0 or 1 (never a signal).
probe() {
	"$PROBE" "$@" >"$T/out" 2>"$T/err" && status=0 || status=$?
	out=$(cat "$T/out")
	if [ -s "$T/err" ]; then echo "stderr not empty:"; cat "$T/err"; return 1; fi
	if [ "$status" -gt 1 ]; then echo "exit $status"; return 1; fi
}

# pil FILE: "w h sum" with sum the FNV-1a of every RGB byte as PIL decodes
# FILE (the probe prints the same hash of ours): whole-image parity.
pil() {
	$PY -c 'import sys; from PIL import Image
im = Image.open(sys.argv[1]).convert("RGB"); h = 1469598103934665603
for x in im.tobytes(): h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
print(im.size[0], im.size[1], "%016x" % h)' "$1"
}

@test "PNG: rgb, grey, palette decode exactly like PIL; 16-bit samples are scaled" {
	for f in rgb grey palette; do
		probe "$F/$f.png"
		[ "$status" -eq 0 ]
		read -r w h sum <<<"$(pil "$F/$f.png")"
		echo "$f: $out / PIL $w $h $sum"
		[[ "$out" == *"\"w\":$w,\"h\":$h,"* ]]
		[[ "$out" == *"\"sum\":\"$sum\""* ]]
	done
	# PIL clips 16-bit grey to 255 when converting; the right 8-bit value
	# of 40000 is round(40000 * 255 / 65535) = 156
	probe "$F/grey16.png"
	[[ "$out" == *'"center":[156,156,156]'* ]]
}

@test "PNG: alpha is composited on white" {
	probe "$F/rgba.png"
	[ "$status" -eq 0 ]
	# alpha 128 over white: (c*128 + 255*127)/255, computed independently
	exp=$($PY -c 'import sys; from PIL import Image
im = Image.open(sys.argv[1]); w, h = im.size; r, g, b, a = im.getpixel((w // 2, h // 2))
print(",".join(str(round((c * a + 255 * (255 - a)) / 255)) for c in (r, g, b)))' "$F/rgba.png")
	[[ "$out" == *"\"center\":[$exp]"* ]]
}

@test "JPEG: baseline, progressive, 4:4:4, grey and CMYK decode exactly like PIL" {
	for f in base prog s444 grey cmyk; do
		probe "$F/$f.jpg"
		[ "$status" -eq 0 ]
		read -r w h sum <<<"$(pil "$F/$f.jpg")"
		echo "$f: $out / PIL $w $h $sum"
		[[ "$out" == *"\"w\":$w,\"h\":$h,"* ]]
		[[ "$out" == *"\"sum\":\"$sum\""* ]]
	done
}

@test "JPEG: EXIF orientation 6 turns a 64x48 image into 48x64" {
	probe "$F/rot6.jpg"
	[ "$status" -eq 0 ]
	[[ "$out" == *'"w":48,"h":64,'* ]]
}

@test "JPEG: all 8 EXIF orientations equal PIL's ImageOps.exif_transpose" {
	for o in 1 2 3 4 5 6 7 8; do
		probe "$F/orient$o.jpg"
		exp=$($PY -c 'import sys; from PIL import Image, ImageOps
im = ImageOps.exif_transpose(Image.open(sys.argv[1])).convert("RGB"); h = 1469598103934665603
for x in im.tobytes(): h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
print(im.size[0], im.size[1], "%016x" % h)' "$F/orient$o.jpg")
		read -r w h sum <<<"$exp"
		echo "orientation $o: $out / PIL $exp"
		[[ "$out" == *"\"w\":$w,\"h\":$h,"*"\"sum\":\"$sum\""* ]]
	done
}

@test "damaged images: one error line each, the good ones still decode, exit 1" {
	probe "$F/rgb.png" "$F/trunc.png" "$F/trunc.jpg" "$F/zero.png" "$F/zero.jpg" \
		"$F/text.png" "$F/corrupt.png" "$F/nonexistent.png" "$F/base.jpg"
	echo "$out"
	[ "$status" -eq 1 ]
	[ "$(printf '%s\n' "$out" | wc -l)" -eq 9 ]
	[ "$(printf '%s\n' "$out" | grep -c '"error":')" -eq 7 ]
	printf '%s\n' "$out" | head -n 1 | grep -q '"w":41'
	printf '%s\n' "$out" | tail -n 1 | grep -q '"w":64'
	printf '%s\n' "$out" | grep 'zero.png' | grep -q '0 bytes'
	printf '%s\n' "$out" | grep 'text.png' | grep -q 'not a PNG or JPEG'
	printf '%s\n' "$out" | grep 'nonexistent' | grep -q 'No such file'
}

@test "decompression bomb is refused from the header; --max-pixels is honoured" {
	probe "$F/bomb.png"
	[ "$status" -eq 1 ]
	[[ "$out" == *'image is 100000x100000 (10000 Mpx), over --max-pixels 64M'* ]]
	probe --max-pixels 1000 "$F/rgb.png"
	[ "$status" -eq 1 ]
	[[ "$out" == *'image is 41x27 (1107 px), over --max-pixels 1K'* ]]
	probe --max-bytes 100 "$F/rgb.png"
	[ "$status" -eq 1 ]
	[[ "$out" == *'over --max-bytes 100'* ]]
}

@test "archives: tar, tar.gz, tar.zst, zip, 7z, cpio; images decode, the text member is an error line" {
	for a in a.tar a.tar.gz a.tar.zst a.zip a.7z a.cpio; do
		[ -s "$F/$a" ] || { echo "no $a"; return 1; }
		probe --archive "$F/$a"
		echo "$a: $out"
		[ "$status" -eq 1 ]
		[ "$(printf '%s\n' "$out" | grep -c '"w":')" -eq 3 ]
		printf '%s\n' "$out" | grep '"member":"notes.txt"' | grep -q '"error":"not an image"'
		printf '%s\n' "$out" | grep -q '"member":"sub/grey.jpg","w":64'
	done
}

@test "archive from stdin (--archive -)" {
	"$PROBE" --archive - <"$F/a.tar.gz" >"$T/out" 2>"$T/err" && status=0 || status=$?
	[ "$status" -eq 1 ]
	[ ! -s "$T/err" ]
	[ "$(grep -c '"w":' "$T/out")" -eq 3 ]
}

@test "hostile archive: traversal names reported as they are, a lying size is refused" {
	probe --archive "$F/hostile.tar"
	echo "$out"
	[ "$status" -eq 1 ]
	printf '%s\n' "$out" | grep -q '"member":"../../etc/evil.png","w":41'
	printf '%s\n' "$out" | grep -q '"member":"/abs/ok.jpg","w":64'
	printf '%s\n' "$out" | grep '"member":"huge.png"' | grep -q 'member is 8589934591 bytes, over --max-bytes'
	probe --archive "$F/short.tar"
	echo "$out"
	printf '%s\n' "$out" | grep -q '"member":"first.png","w":41'
	printf '%s\n' "$out" | grep '"member":"short.png"' | grep -q '"error":'
}

@test "corrupt and non-archives: an error line and a clean end" {
	probe --archive "$F/cut.tar.gz"
	echo "$out"
	[ "$status" -eq 1 ]
	printf '%s\n' "$out" | tail -n 1 | grep -q '"error":'
	probe --archive "$F/rgb.png"
	[ "$status" -eq 1 ]
	[[ "$out" == *'not a readable archive'* ]]
	probe --archive "$F/zero.png"
	[ "$status" -eq 0 ]
	[ -z "$out" ]
	probe --archive "$F/nonexistent.tar"
	[ "$status" -eq 1 ]
	[[ "$out" == *'No such file'* ]]
}

@test "video: --frames N samples uniformly, --fps F by time" {
	probe --frames 5 --video test/fixtures/media/tiny.mp4
	echo "$out"
	[ "$status" -eq 0 ]
	[ "$(printf '%s\n' "$out" | grep -o '"frame":[0-9]*' | tr '\n' ' ')" = '"frame":3 "frame":9 "frame":15 "frame":21 "frame":27 ' ]
	probe --fps 2 --video test/fixtures/media/tiny.mp4
	[ "$status" -eq 0 ]
	[ "$(printf '%s\n' "$out" | grep -o '"t":[0-9.]*' | tr '\n' ' ')" = '"t":0.000 "t":0.500 "t":1.000 "t":1.500 "t":2.000 "t":2.500 ' ]
}

@test "unreadable video: garbage named .mp4, zero bytes, a missing file, over --max-pixels" {
	yes "not a video" | head -c 3000 >"$T/bad.mp4"
	: >"$T/zero.mp4"
	for v in "$T/bad.mp4" "$T/zero.mp4" "$F/nonexistent.mp4"; do
		probe --frames 4 --video "$v"
		echo "$v: $out"
		[ "$status" -eq 1 ]
		[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ]
		[[ "$out" == *'"error":'* ]]
	done
	probe --max-pixels 100 --video test/fixtures/media/tiny.mp4
	[ "$status" -eq 1 ]
	[[ "$out" == *'over --max-pixels 100'* ]]
}
