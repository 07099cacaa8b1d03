#!/usr/bin/env bash
# Mutation check of joblib's invariants (docs/mutants.md). Each file
# scripts/mutants/<name>.mutant describes one realistic bug: a literal one-line
# edit of one source file and the tests that must catch it. For every mutant
# (or those named on the command line) this copies the tree to a scratch
# directory, applies the edit, runs the named tests and prints a table:
#
#   caught            the tests failed (or timed out) with the bug in place
#   SURVIVED          the tests passed with the bug in place: a gap in the suite
#   no longer applies `find` does not occur exactly once in `file` any more
#   does not build    the edited tree does not compile: fix the mutant
#
# Exit status: 0 when every mutant run was caught, 1 otherwise.
#
#   bash scripts/mutants.sh                      # all mutants
#   bash scripts/mutants.sh epoch-fence claim-fifo
#   MUTANT_TIMEOUT=300 bash scripts/mutants.sh   # seconds per mutant (default 600)
#   MUTANT_KEEP=1 bash scripts/mutants.sh ...    # keep the scratch tree and logs
#   bash scripts/mutants.sh --check              # only: does every mutant still apply
#                                                # to exactly one place? (seconds; the
#                                                # test command runs it)
#
# Needs what scripts/test.sh sets up (PostgreSQL at JOBLIB_TEST_DATABASE_URL,
# npm ci in server/testdata/node for the Node client tests).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=$root/scripts/mutants

export GOTOOLCHAIN=local
: "${JOBLIB_TEST_DATABASE_URL:=postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
export JOBLIB_TEST_DATABASE_URL
timeout_s=${MUTANT_TIMEOUT:-600}

die() { printf 'mutants: %s\n' "$*" >&2; exit 2; }

# parse FILE: sets m_file m_find m_replace m_pkg m_run m_what, or fails.
parse() {
  local f=$1 line key val
  m_file='' m_find='' m_replace='' m_pkg='' m_run='' m_what=''
  local have_find=0 have_replace=0
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%$'\r'}
    case $line in
      '#'*)
        [ -z "$m_what" ] && m_what=${line#\#} && m_what=${m_what# }
        continue ;;
      '') continue ;;
    esac
    case $line in
      *:*) ;;
      *) echo "$f: not a 'key: value' line: $line" >&2; return 1 ;;
    esac
    key=${line%%:*}
    val=${line#*:}
    val=${val# } # one separating space; the rest is literal
    case $key in
      file) m_file=$val ;;
      find) m_find=$val; have_find=1 ;;
      replace) m_replace=$val; have_replace=1 ;;
      pkg) m_pkg=$val ;;
      run) m_run=$val ;;
      *) echo "$f: unknown key '$key'" >&2; return 1 ;;
    esac
  done <"$f"
  if [ -z "$m_file" ] || [ "$have_find" = 0 ] || [ -z "$m_find" ] || [ "$have_replace" = 0 ] || [ -z "$m_pkg" ]; then
    echo "$f: needs file:, find:, replace: and pkg: (run: is optional)" >&2
    return 1
  fi
}

# occurrences FIND FILE: how many times the literal FIND occurs in FILE.
occurrences() {
  FIND=$1 perl -0777 -ne '$n = () = /\Q$ENV{FIND}\E/g; print $n' "$2"
}

# apply FIND REPLACE FILE: replaces the single literal occurrence.
apply() {
  FIND=$1 REPL=$2 perl -0777 -pi -e 's/\Q$ENV{FIND}\E/$ENV{REPL}/' "$3"
}

shopt -s nullglob
check_only=0
if [ "${1:-}" = --check ]; then
  check_only=1
  shift
fi
if [ $# -gt 0 ]; then
  files=()
  for n in "$@"; do
    n=${n%.mutant}
    [ -f "$dir/$n.mutant" ] || die "no mutant $dir/$n.mutant"
    files+=("$dir/$n.mutant")
  done
else
  files=("$dir"/*.mutant)
fi
[ ${#files[@]} -gt 0 ] || die "no mutants in $dir"

# Validate every file before the long part starts.
for f in "${files[@]}"; do
  parse "$f" || die "bad mutant file $f"
done

# --check: a mutant whose code moved would report 'no longer applies' only
# when someone runs the long table; say it now, in seconds.
if [ "$check_only" = 1 ]; then
  stale=0
  for f in "${files[@]}"; do
    parse "$f"
    if [ ! -f "$root/$m_file" ]; then
      echo "mutant $(basename "$f" .mutant): $m_file does not exist" >&2
      stale=1
    elif n=$(occurrences "$m_find" "$root/$m_file") && [ "$n" != 1 ]; then
      echo "mutant $(basename "$f" .mutant): its find text occurs $n times in $m_file, not once" >&2
      stale=1
    fi
  done
  [ "$stale" = 0 ] && echo "all ${#files[@]} mutants apply to exactly one place"
  exit "$stale"
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/joblib-mutants.XXXXXX")
logs=$scratch/logs
tree=$scratch/tree
mkdir -p "$logs" "$tree"
if [ -z "${MUTANT_KEEP:-}" ]; then
  trap 'rm -rf "$scratch"' EXIT
fi
# One copy of the tree (the work tree as it is, uncommitted changes included);
# each mutant edits one file and the file is restored afterwards. The Go
# build cache is shared, so only the mutated packages rebuild.
rsync -a --exclude .git "$root/" "$tree/" || die "copy the tree to $tree"

printf '%-34s %-17s %7s\n' mutant result seconds
printf '%-34s %-17s %7s\n' ------ ------ -------
bad=0
for f in "${files[@]}"; do
  name=$(basename "$f" .mutant)
  parse "$f"
  start=$SECONDS
  target=$tree/$m_file
  if [ ! -f "$target" ]; then
    result='no longer applies'
  elif [ "$(occurrences "$m_find" "$target")" != 1 ]; then
    result='no longer applies'
  else
    # Restore from the scratch tree's own copy, never from the work tree:
    # the work tree may change while the (long) run goes on.
    cp "$target" "$scratch/original"
    apply "$m_find" "$m_replace" "$target"
    read -r -a pkgs <<<"$m_pkg"
    log=$logs/$name.log
    {
      echo "# $m_what"
      echo "# $m_file: '$m_find' -> '$m_replace'"
    } >"$log"
    if ! (cd "$tree" && go build ./...) >>"$log" 2>&1; then
      result='does not build'
    else
      args=(test -count=1 -timeout "${timeout_s}s")
      [ -n "$m_run" ] && args+=(-run "$m_run")
      (cd "$tree" && timeout --kill-after=30 $((timeout_s + 60)) go "${args[@]}" "${pkgs[@]}") >>"$log" 2>&1
      rc=$?
      case $rc in
        0) result='SURVIVED' ;;
        124 | 137) result='caught (timeout)' ;;
        *)
          if grep -q '\[build failed\]\|\[setup failed\]' "$log"; then
            result='does not build'
          elif grep -q '^FAIL\|^--- FAIL\|panic: test timed out' "$log"; then
            result='caught'
          else
            result="error (rc $rc)"
          fi ;;
      esac
    fi
    cp "$scratch/original" "$target"
  fi
  case $result in caught*) ;; *) bad=1 ;; esac
  printf '%-34s %-17s %7d\n' "$name" "$result" $((SECONDS - start))
done
if [ -n "${MUTANT_KEEP:-}" ]; then
  echo "logs: $logs" >&2
elif [ "$bad" = 1 ]; then
  # Keep the logs of a failing run; the tree is large and rebuilt next time.
  keep=$(mktemp -d "${TMPDIR:-/tmp}/joblib-mutant-logs.XXXXXX")
  cp -r "$logs/." "$keep/"
  echo "logs: $keep" >&2
fi
exit "$bad"
