# Shared by the scripts that build the test images from Debian's packages (sourced, not run):
# reusing an image already built, and copying a binary with the shared libraries it loads into
# the root filesystem "$root" that becomes the image.

# If "$1" (local/<server>:<version>) exists, tags it local/<server>:debian, prints it, records
# it in target/<server>-image, and exits the calling script.
reuse_image() {
  local image=$1 server=$2
  if docker image inspect "$image" >/dev/null 2>&1; then
    docker tag "$image" "local/$server:debian"
    echo "$image" | tee "target/$server-image"
    exit 0
  fi
}

# Tags a freshly built "$1" local/<server>:debian, prints it, and records it.
record_image() {
  local image=$1 server=$2
  docker tag "$image" "local/$server:debian"
  echo "built $image" >&2
  echo "$image" | tee "target/$server-image"
}

# Copies a file and every shared library `ldd` lists for it (ldd already follows dependencies)
# into "$root".
copy_with_libs() {
  local file=$1 dest=$2 lib
  cp -L "$file" "$root$dest"
  # ldd prints "name => /path (addr)" or "/path (addr)" for the loader; copy every path.
  for lib in $(ldd "$file" 2>/dev/null | grep -o '/[^ ]*' || true); do
    mkdir -p "$root$(dirname "$lib")"
    cp -Ln "$lib" "$root$lib"
  done
}
