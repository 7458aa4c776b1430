# Skipped cases for the shell tests that source tests/support/shtest.sh (sourced after it):
#   skip NAME "why it cannot run here"      prints SKIP and remembers the case
#   write_junit_skips SUITE                 write_junit, plus a <skipped> case per skip, which
#                                           tests/run.sh lists as skipped and does not count
SKIPPED=()

skip() {  # name reason
  SKIPPED+=("$1|$2")
  echo "SKIP $1: $2"
  return 0
}

write_junit_skips() {  # suite
  write_junit "$1"
  [ -n "${XML_OUTPUT_FILE:-}" ] && [ ${#SKIPPED[@]} -gt 0 ] || return 0
  local c name msg cases=""
  for c in "${SKIPPED[@]}"; do
    name=${c%%|*}; msg=${c#*|}
    msg=$(printf '%s' "$msg" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g')
    cases+="  <testcase classname=\"$1\" name=\"$name\"><skipped message=\"$msg\"/></testcase>\n"
  done
  local tmp="$XML_OUTPUT_FILE.tmp"
  awk -v add="$cases" '/<\/testsuite>/ { printf "%s", add } { print }' "$XML_OUTPUT_FILE" >"$tmp" &&
    mv "$tmp" "$XML_OUTPUT_FILE"
}
