# Sourced by the harnesses that judge `scenario-run serve` (tests/e2b_sdk/run.sh and what it
# calls, tests/opensandbox_sdk/run.sh, bench/run): the judges are pinned here, under
# tests/judges/ (or $JUDGES_DIR, which scripts/judges-latest points at the newest):
#   NAME/requirements.txt   a Python judge: every package `==` pinned (pip freeze of its venv)
#   NAME/requirements.in    the packages it is made of, unpinned (what scripts/judges-latest
#                           resolves to the newest)
#   NAME/package.json       an npm judge: exact versions, with its package-lock.json (npm ci)
#   NAME/suite              "owner/repository commit": the test suite's repository on GitHub
#                           and the commit it is taken at
# The callers set $root (the checkout) and $target (its target directory).
#
#   judge_venv NAME [SPEC…]   prints the python of a venv with exactly NAME's requirements (and
#                             SPECs, e.g. a local SDK, installed over them without their
#                             dependencies, and then not held to `pip check`: the SDK of a
#                             suite's commit may say another version): made once under
#                             $target/e2b-venvs/NAME-<hash of the pins>, so new pins make a new venv
#   judge_npm NAME DIR        installs NAME's package.json and lock into DIR (npm ci), once per pin
#   judge_suite NAME VAR      finds the commit of NAME/suite; sets $suite_git (a git directory
#                             that has it), $suite_commit, $suite_repo and $suite_from. Where:
#                               1. a clone under $target/judges-src/, fetched from GitHub when
#                                  the network allows (JUDGES_OFFLINE=1: never; gives up after
#                                  JUDGES_FETCH_TIMEOUT seconds, default 8)
#                               2. the repository $VAR names (a checkout or a bare git directory)
#                               3. a mirror beside the checkout: ../.mirror/<owner>+<name>/repo
#                             Returns 0 when found; 2 when there is no source at all (the caller
#                             says SKIPPED, loudly); 1 when a source is there but lacks the
#                             pinned commit (the caller FAILS: a stale mirror or a wrong pin
#                             must not pass as a skip, nor run another commit's suite).
#                             A suite file whose commit is HEAD takes the newest commit of the
#                             first source found (scripts/judges-latest only).
judges="${JUDGES_DIR:-$root/tests/judges}"

_judge_hash() { cat "$@" 2>/dev/null | sha256sum | cut -c1-12; }

judge_venv() {
  local name="$1"
  shift
  local req="$judges/$name/requirements.txt"
  [ -f "$req" ] || { echo "judges: $req is missing" >&2; return 1; }
  local hash
  hash="$(printf '%s\n' "$@" | cat "$req" - | sha256sum | cut -c1-12)"
  local dir="${venvs:-$target/e2b-venvs}/$name-$hash"
  if [ ! -f "$dir/.pinned" ]; then
    rm -rf "$dir"
    echo "judges: installing $name ($req${*:+ and $*}) into $dir" >&2
    python3 -m venv "$dir" >&2 \
      && "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2 \
      && { [ $# -eq 0 ] || "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps "$@" >&2; } \
      && { [ $# -gt 0 ] || "$dir/bin/pip" check >/dev/null || "$dir/bin/pip" check >&2; } \
      && touch "$dir/.pinned" \
      || { echo "judges: cannot install the pins of $name ($req)" >&2; return 1; }
  fi
  echo "$dir/bin/python"
}

judge_npm() {
  local name="$1" dir="$2" pins="$judges/$1"
  [ -f "$pins/package.json" ] || { echo "judges: $pins/package.json is missing" >&2; return 1; }
  local hash
  hash="$(_judge_hash "$pins/package.json" "$pins/package-lock.json")"
  mkdir -p "$dir"
  if [ "$(cat "$dir/.pinned" 2>/dev/null)" != "$hash" ] || [ ! -d "$dir/node_modules" ]; then
    rm -rf "$dir/node_modules" "$dir/package-lock.json"
    cp "$pins/package.json" "$dir/"
    if [ -f "$pins/package-lock.json" ]; then
      cp "$pins/package-lock.json" "$dir/"
      (cd "$dir" && npm ci --no-audit --no-fund --silent) >&2 || { echo "judges: npm ci of $name failed" >&2; return 1; }
    else
      (cd "$dir" && npm install --no-audit --no-fund --silent) >&2 || { echo "judges: npm install of $name failed" >&2; return 1; }
    fi
    echo "$hash" >"$dir/.pinned"
  fi
}

_judge_has() { git --git-dir="$1" cat-file -e "$2^{commit}" 2>/dev/null; }

# _judge_gitdir PATH: the git directory of a checkout or a bare repository at PATH.
_judge_gitdir() {
  if [ -d "$1/.git" ]; then echo "$1/.git"; else echo "$1"; fi
}

judge_suite() {
  local name="$1" var="$2" file="$judges/$1/suite"
  suite_git="" suite_from=""
  [ -f "$file" ] || { echo "judges: $file is missing" >&2; return 1; }
  read -r suite_repo suite_commit < <(grep -vE '^[[:space:]]*(#|$)' "$file" | head -1)
  [ -n "${suite_repo:-}" ] && [ -n "${suite_commit:-}" ] || { echo "judges: $file says no \"owner/repository commit\"" >&2; return 1; }
  local want="$suite_commit"
  # 1. A clone under target/: the pinned commit alone, fetched once.
  local cache="$target/judges-src/${suite_repo/\//+}.git"
  if [ "$want" != HEAD ] && _judge_has "$cache" "$want"; then
    suite_git="$cache" suite_from="the clone $cache"
    return 0
  fi
  if [ "${JUDGES_OFFLINE:-0}" != 1 ]; then
    mkdir -p "$(dirname "$cache")"
    [ -d "$cache" ] || git init --quiet --bare "$cache"
    local err
    if err="$(timeout "${JUDGES_FETCH_TIMEOUT:-8}" git --git-dir="$cache" -c http.lowSpeedLimit=1000 -c http.lowSpeedTime=5 \
      fetch --quiet --depth 1 "https://github.com/$suite_repo" "$want" 2>&1)"; then
      [ "$want" = HEAD ] && suite_commit="$(git --git-dir="$cache" rev-parse FETCH_HEAD)"
      if _judge_has "$cache" "$suite_commit"; then
        suite_git="$cache" suite_from="github.com/$suite_repo (cloned into $cache)"
        return 0
      fi
    fi
    echo "judges: cannot fetch $suite_repo at $want from github.com (${err##*$'\n'}); looking for \$$var, then ../.mirror" >&2
  fi
  # 2. The repository the variable names; 3. a mirror beside the checkout.
  local where from
  if [ -n "${!var:-}" ]; then
    where="${!var}" from="\$$var=${!var}"
  else
    where="$(cd "$root/.." && pwd)/.mirror/${suite_repo/\//+}/repo"
    from="the mirror beside the checkout ($where)"
    [ -e "$where" ] || return 2
  fi
  local git_dir
  git_dir="$(_judge_gitdir "$where")"
  if [ "$want" = HEAD ]; then
    suite_commit="$(git --git-dir="$git_dir" rev-parse HEAD 2>/dev/null)" || {
      echo "judges: $from is not a git repository" >&2
      return 1
    }
  fi
  if ! _judge_has "$git_dir" "$suite_commit"; then
    echo "judges: FAILED: $from does not have the pinned commit $suite_commit of $suite_repo ($file):" \
      "update that repository, or move the pin on purpose (scripts/judges-latest)" >&2
    return 1
  fi
  suite_git="$git_dir" suite_from="$from"
  return 0
}
