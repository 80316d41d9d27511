#!/bin/sh
# Render the PNG icons shipped in app/data/icons from the SVG (needs rsvg-convert:
# Debian/Ubuntu `apt install librsvg2-bin`, macOS `brew install librsvg`).
set -eu
cd "$(dirname "$0")/../../app/data/icons"
for size in 48 128 256 512; do
    rsvg-convert -w "$size" -h "$size" draftlight.svg -o "draftlight-$size.png"
done
echo "rendered draftlight-{48,128,256,512}.png in $(pwd)"
