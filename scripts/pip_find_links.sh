# Sourced by scripts/demo.sh and scripts/test.sh: `find_links`, uv's `--find-links` for each directory
# pip's configuration or PIP_FIND_LINKS names (a machine may keep wheels there, such as torch's CPU
# build); uv reads neither. Empty where pip has none.
find_links=()
for dir in ${PIP_FIND_LINKS:-} $(.venv/bin/pip config get global.find-links 2>/dev/null || true); do
  find_links+=(--find-links "$dir")
done
