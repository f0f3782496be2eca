#!/usr/bin/env bash
# Installs edged as a systemd service on Raspberry Pi OS or JetPack (idempotent: run it again to upgrade).
#
#   sudo deploy/install.sh                 # install or upgrade from this checkout, enable the service
#   sudo deploy/install.sh --start         # ... and start it now
#   sudo deploy/install.sh --uninstall     # stop and remove the service and the venv; keeps config and data
#   sudo deploy/install.sh --uninstall --purge   # ... and /etc/edged, /var/lib/edged and the user too
#
# Options: --platform pi|jetson|generic (default: detected), --prefix DIR (install into a staging root,
# e.g. for packaging or tests: users are created in DIR/etc, the unit is enabled offline there),
# --no-enable, --with-systemd-python (apt-installs its build dependencies, then the `systemd` extra),
# --no-gpu-check (a Jetson image built where the GPU is not reachable, e.g. a chroot on another machine).
#
# Platform packages: on a Jetson (always) and on a Pi with the distribution's python3-opencv (for
# libcamera/GStreamer) the venv sees the system's packages, and pip installs only the dependencies the
# platform does not provide (deploy/pydeps.py): NVIDIA's onnxruntime-gpu and JetPack's OpenCV stay in use.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
prefix=""
platform=""
action=install
purge=0
start=0
enable=1
with_systemd=0
gpu_check=1

while [ $# -gt 0 ]; do
  case "$1" in
    --uninstall) action=uninstall ;;
    --purge) purge=1 ;;
    --start) start=1 ;;
    --no-enable) enable=0 ;;
    --with-systemd-python) with_systemd=1 ;;
    --no-gpu-check) gpu_check=0 ;;
    --prefix) prefix=$(realpath -m "$2"); shift ;;
    --platform) platform="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { printf 'edged-install: %s\n' "$*"; }
die() { printf 'edged-install: error: %s\n' "$*" >&2; exit 1; }

venv="$prefix/opt/edged/venv"
etc="$prefix/etc/edged"
state="$prefix/var/lib/edged"
unit_dir="$prefix/etc/systemd/system"
bin_link="$prefix/usr/local/bin/edged"

[ -n "$prefix" ] || [ "$(id -u)" -eq 0 ] || die "run as root (sudo), or give --prefix DIR for a staging install"

if [ -z "$platform" ]; then
  platform=generic
  if [ -e "$prefix/etc/nv_tegra_release" ]; then
    platform=jetson
  elif [ -z "$prefix" ] && grep -qi raspberry /proc/device-tree/model 2>/dev/null; then
    platform=pi
  fi
fi
case "$platform" in pi|jetson|generic) ;; *) die "--platform must be pi, jetson or generic" ;; esac

systemd_live() { [ -z "$prefix" ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; }

ensure_user() {
  local useradd_args=(--system --gid edged --home-dir /var/lib/edged --no-create-home --shell /usr/sbin/nologin
                      --comment "edged inference daemon")
  if [ -z "$prefix" ]; then
    getent group edged >/dev/null 2>&1 || { groupadd --system edged; say "created group edged"; }
    if ! id edged >/dev/null 2>&1; then
      useradd "${useradd_args[@]}" --groups video edged
      say "created user edged (groups: edged, video)"
    fi
    return
  fi
  # a staging root: only its own user database counts, never this machine's
  if [ ! -e "$prefix/etc/passwd" ] || [ ! -e "$prefix/etc/group" ]; then
    say "no user database in $prefix/etc (an empty staging root): the edged user is not created there;" \
        "create it on the target: groupadd --system edged && useradd ${useradd_args[*]:0:8} --groups video edged"
    return
  fi
  grep -q '^edged:' "$prefix/etc/group" || { groupadd --prefix "$prefix" --system edged; say "created group edged"; }
  if ! grep -q '^edged:' "$prefix/etc/passwd"; then
    local groups=() also=""
    grep -q '^video:' "$prefix/etc/group" && groups=(--groups video) && also=", video"
    useradd --prefix "$prefix" "${useradd_args[@]}" "${groups[@]}" edged
    say "created user edged (groups: edged$also)"
  fi
}

system_site() {
  # the platform's own onnxruntime-gpu / OpenCV must win over PyPI's wheels
  [ "$platform" = jetson ] && return 0
  [ "$platform" = pi ] && python3 -c 'import cv2' >/dev/null 2>&1 && return 0
  return 1
}

install_venv() {
  mkdir -p "$(dirname "$venv")"
  local site=()
  system_site && site=(--system-site-packages)
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "${site[@]}" "$venv" || die "python3 -m venv failed: install python3-venv (apt)"
    say "created $venv${site[*]:+ (with the system packages visible)}"
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  say "installing edged from $repo into $venv"
  if [ ${#site[@]} -gt 0 ]; then
    local reqs
    reqs=$("$venv/bin/python" "$repo/deploy/pydeps.py" --explain 2> >(sed 's/^/edged-install: /' >&2)) \
      || die "a platform package is broken (above)"
    "$venv/bin/python" -m pip install -q --upgrade --no-deps "$repo" 2>&1 | grep -vE '^(WARNING: Location|  )' || true
    # shellcheck disable=SC2086  # one requirement per line, none with spaces
    [ -z "$reqs" ] || "$venv/bin/python" -m pip install -q $reqs 2>&1 | grep -vE '^(WARNING: Location|  )' || true
  else
    "$venv/bin/python" -m pip install -q --upgrade "$repo" 2>&1 | grep -vE '^(WARNING: Location|  )' || true
  fi
  if [ "$with_systemd" -eq 1 ]; then
    install_systemd_python
  fi
  # a crash (an emulator, a wheel for another CPU) is told apart from a module that did not install
  "$venv/bin/python" "$repo/deploy/pydeps.py" --check onnxruntime cv2 edged.daemon 2> >(sed 's/^/edged-install: /' >&2) \
    || die "the venv in $venv is not usable (above)"
  mkdir -p "$(dirname "$bin_link")"
  ln -sfn /opt/edged/venv/bin/edged "$bin_link"
}

install_systemd_python() {
  # systemd-python has no wheels for arm64: pip builds it, with these
  local deps=(gcc python3-dev libsystemd-dev pkg-config)
  if [ -z "$prefix" ] && command -v apt-get >/dev/null; then
    say "installing systemd-python's build dependencies (apt): ${deps[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${deps[@]}" >/dev/null \
      || die "apt-get install ${deps[*]} failed"
  fi
  "$venv/bin/python" -m pip install -q "systemd-python>=234" \
    || die "systemd-python did not build: it needs ${deps[*]} (apt)"
  "$venv/bin/python" "$repo/deploy/pydeps.py" --check systemd.journal || die "systemd-python does not import"
}

report_runtime() {
  # what the installed onnxruntime offers and whether OpenCV can open GStreamer pipelines
  local providers gst
  providers=$("$venv/bin/python" -c 'import onnxruntime as o; print(" ".join(o.get_available_providers()))')
  gst=$("$venv/bin/python" -c '
import cv2, re
m = re.search(r"GStreamer:\s*(\w+)", cv2.getBuildInformation())
print(m.group(1) if m else "NO")')
  say "onnxruntime $("$venv/bin/python" -c 'import onnxruntime as o; print(o.__version__)') offers: $providers"
  say "OpenCV $("$venv/bin/python" -c 'import cv2; print(cv2.__version__)') GStreamer: $gst"
  if [ "$platform" = jetson ] && [ "$gpu_check" -eq 1 ]; then
    case " $providers " in
      *" TensorrtExecutionProvider "*|*" CUDAExecutionProvider "*) ;;
      *) die "this is a Jetson, but onnxruntime offers no CUDA or TensorRT provider: install NVIDIA's onnxruntime-gpu wheel for your JetPack system-wide (docs/getting-started.md, Supported platforms), then run this again (or --no-gpu-check to build an image elsewhere)" ;;
    esac
  fi
}

install_files() {
  install -d -m 0755 "$unit_dir"
  install -m 0644 "$repo/systemd/edged.service" "$unit_dir/edged.service"
  if [ "$platform" = jetson ]; then
    install -d -m 0755 "$unit_dir/edged.service.d"
    install -m 0644 "$repo/systemd/edged.service.d/jetson-gpu.conf" "$unit_dir/edged.service.d/jetson-gpu.conf"
  fi
  install -d -m 0750 "$etc"
  local example="$repo/deploy/edged.$platform.yaml"
  [ "$platform" = generic ] && example="$repo/deploy/edged.pi.yaml"
  if [ ! -e "$etc/edged.yaml" ]; then
    install -m 0640 "$example" "$etc/edged.yaml"
    say "wrote $etc/edged.yaml from $(basename "$example") (edit it: broker, camera, model)"
  else
    say "kept the existing $etc/edged.yaml"
  fi
  install -d -m 0750 "$state" "$state/models"
  for m in digits.int8.onnx vibration.int8.onnx; do
    [ -e "$state/models/$m" ] || install -m 0640 "$repo/edged/assets/$m" "$state/models/$m"
  done
  if [ -z "$prefix" ]; then
    chown -R root:edged "$etc"
    chown -R edged:edged "$state"
  fi
}

enable_service() {
  if systemd_live; then
    systemctl daemon-reload
    [ "$enable" -eq 1 ] && systemctl enable edged >/dev/null 2>&1 && say "enabled edged.service"
    if [ "$start" -eq 1 ]; then
      systemctl restart edged && say "started edged.service"
    elif systemctl is-active --quiet edged; then
      systemctl restart edged && say "restarted the running edged.service with the new version"
    fi
  elif [ "$enable" -eq 1 ]; then
    # an image build (pi-gen, a chroot) or a staging root: enabling is only a symlink, offline
    local wants="$unit_dir/multi-user.target.wants"
    if command -v systemctl >/dev/null && systemctl --root="${prefix:-/}" enable edged >/dev/null 2>&1; then
      say "enabled edged.service offline (systemctl --root=${prefix:-/}; no running systemd here)"
    else
      install -d -m 0755 "$wants"
      ln -sfn /etc/systemd/system/edged.service "$wants/edged.service"
      say "enabled edged.service offline (symlink in $wants; no running systemd here)"
    fi
  else
    say "no running systemd here and --no-enable: the unit stays disabled"
  fi
}

uninstall() {
  if systemd_live; then
    systemctl disable --now edged >/dev/null 2>&1 || true
  fi
  rm -f "$unit_dir/edged.service" "$unit_dir/edged.service.d/jetson-gpu.conf" "$bin_link" \
    "$unit_dir/multi-user.target.wants/edged.service"
  rmdir "$unit_dir/edged.service.d" 2>/dev/null || true
  rm -rf "$prefix/opt/edged"
  systemd_live && systemctl daemon-reload
  say "removed the service and $prefix/opt/edged"
  if [ "$purge" -eq 1 ]; then
    rm -rf "$etc" "$state"
    local root_args=()
    [ -n "$prefix" ] && root_args=(--prefix "$prefix")
    userdel "${root_args[@]}" edged 2>/dev/null || true
    groupdel "${root_args[@]}" edged 2>/dev/null || true
    say "purged $etc, $state and the edged user"
  else
    say "kept $etc and $state (add --purge to remove them)"
  fi
}

if [ "$action" = uninstall ]; then
  uninstall
  exit 0
fi

say "platform: $platform${prefix:+, prefix $prefix}"
ensure_user
install_venv
report_runtime
install_files
enable_service
cat <<EOF

Next steps:
  1. Edit /etc/edged/edged.yaml (broker host, camera, model), then check it:
       edged check-config /etc/edged/edged.yaml
  2. Start it and look at it:
       sudo systemctl start edged
       edged status --config /etc/edged/edged.yaml      (members of group edged, or root)
       journalctl -u edged -f
  3. Secrets: put the MQTT password in /etc/edged/mqtt-password (chmod 640, group edged) and set
     mqtt.password_file, or use systemd/edged.service.d/credentials.conf.example.
EOF
