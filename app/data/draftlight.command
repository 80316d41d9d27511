#!/bin/sh
# draftlight.command: double-click in Finder (macOS) to open draftlight in Terminal.
#
# Works as it is when `draftlight` is on your PATH (pipx puts it in ~/.local/bin);
# `draftlight install-desktop` puts a copy with the absolute path filled in below
# inside ~/Applications/draftlight.app.

set -- draftlight "$@"  # @DRAFTLIGHT_COMMAND@

# A shell started from Finder may not have pipx's or Homebrew's folders on PATH.
PATH="$HOME/.local/bin:/opt/homebrew/bin:/usr/local/bin:$PATH"
export PATH

"$@"
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 130 ]; then
    printf "\n[draftlight exited with status %s; press Enter to close]" "$rc"
    read -r _
fi
exit "$rc"
