#!/usr/bin/env bash
# Cold and warm times of docker/build-local.sh and the image sizes, as a Markdown table (the
# README's "Deployment" numbers come from this script).
#   usage: docker/measure-build.sh [--cold]
# --cold first deletes every image build-local.sh makes (the base too; Docker's classic builder
# keeps its cache in those images) and builds with an empty wheel cache (a temporary
# DLR_WHEEL_CACHE): a clean clone on a machine with the Docker engine but nothing built yet.
# Then: a rebuild with nothing changed, and one after a change to a source file (a copy of the
# tree with one comment line added to server/cli.py: only the project-install layer reruns).
set -euo pipefail
cd "$(dirname "$0")/.."
images=(dlr-serve:cpu dlr-serve:cpu-build dlr-local/python:3.11-bookworm dlr-local/redis:bookworm
  dlr-local/haproxy:bookworm dlr-local/prometheus:bookworm)
timed() {  # label, command...: run it, print "| label | N s |"
  local label=$1 t0 t1
  shift
  t0=$(date +%s.%N)
  "$@" >/tmp/dlr-measure-build.log 2>&1 || { tail -20 /tmp/dlr-measure-build.log; exit 1; }
  t1=$(date +%s.%N)
  printf '| %s | %.0f s |\n' "$label" "$(echo "$t1 - $t0" | bc)"
}
echo "machine: $(nproc) cores, $(uname -r), Docker $(docker version --format '{{.Server.Version}}'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| build-local.sh | time |"
echo "|---|---|"
if [ "${1:-}" = "--cold" ]; then
  docker rmi -f "${images[@]}" >/dev/null 2>&1 || true
  docker image prune -f >/dev/null
  fresh=$(mktemp -d)
  trap 'rm -rf "$fresh"' EXIT
  timed "cold (no images, empty wheel cache)" env DLR_WHEEL_CACHE="$fresh" bash docker/build-local.sh
fi
timed "warm (nothing changed)" bash docker/build-local.sh
# a source change, in a copy of the tree (this checkout stays as it is)
copy=$(mktemp -d)
git ls-files -z | xargs -0 cp --parents -t "$copy"
echo "# measure-build.sh: a changed source file" >>"$copy/server/cli.py"
cp -l docker/wheelhouse/*.whl "$copy/docker/wheelhouse/" 2>/dev/null || true
timed "after a change to server/cli.py" bash "$copy/docker/build-local.sh"
rm -rf "$copy"
bash docker/build-local.sh >/dev/null 2>&1  # the tags back on this checkout's images
echo
echo "| image | size |"
echo "|---|---|"
for i in "${images[@]}"; do
  printf '| `%s` | %s |\n' "$i" "$(docker image ls --format '{{.Size}}' "$i")"
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
