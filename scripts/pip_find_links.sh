# Sourced by scripts/demo.sh, test.sh, lock.sh and latest.sh: `find_links`, uv's `--find-links` for each directory
# pip's configuration or PIP_FIND_LINKS names (a machine may keep wheels there, such as torch's CPU
# build); uv reads neither. Empty where pip has none. PIP: the pip that reads the configuration (.venv's).
find_links=()
for dir in ${PIP_FIND_LINKS:-} $("${PIP:-.venv/bin/pip}" config get global.find-links 2>/dev/null || true); do
  find_links+=(--find-links "$dir")
done
