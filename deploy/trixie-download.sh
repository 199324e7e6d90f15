# trixie-download.sh -- sourced by the deploy installers: `trixie_download DIR PACKAGE...` downloads
# Debian 13 (trixie) .deb packages into DIR with a private apt state (the system's own mirror, its
# package lists untouched), for the binaries the installers need from a newer Debian than the
# machine's. Nothing is installed system-wide; the caller unpacks what it needs.
trixie_download() {
  local dir=$1; shift
  local apt=$dir/apt uri
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/etc"
  uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list)
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
    "$uri" /usr/share/keyrings/debian-archive-keyring.gpg >"$apt/etc/trixie.sources"
  local options=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt/etc"
    -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o Dir::State::status=/dev/null
    -o APT::Architecture="$(dpkg --print-architecture)" -o APT::Sandbox::User=root)
  apt-get -qq "${options[@]}" update >&2
  (cd "$dir" && apt-get -qq "${options[@]}" download "$@" >&2)
}
