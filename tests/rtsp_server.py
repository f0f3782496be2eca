"""A real RTSP camera for the tests: GStreamer's RTSP server (Debian's gir1.2-gst-rtsp-server-1.0, driven from
the system python3 with PyGObject; `scripts/setup dev` installs them). It serves the frames of a video as
Motion JPEG (RTP/JPEG) at rtsp://127.0.0.1:PORT/cam, looping, optionally behind Basic authentication; with
RTSP_CODEC=h264 (or h265) as an IP camera sends it (x264enc / x265enc, gstreamer1.0-plugins-ugly / -bad);
with RTSP_TRANSPORTS=tcp (or udp) it offers that RTSP transport alone.

    /usr/bin/python3 tests/rtsp_server.py PORT FRAMES_DIR FPS [USER PASSWORD]

FRAMES_DIR holds the frames as JPEG files, served in name order (tests/rtspcam.py writes them from a video).
With RTSP_PUSH_LOG=FILE in the environment, each push appends "FRAME UNIX_TIME" to FILE (FRAME: its place
in FRAMES_DIR): the stream's own
clock, against which benchmarks/rtsp_latency.py measures capture-to-result latency.
This file runs outside edged's venv, so it imports nothing from edged and is left out of its type checks.
"""

import os
import sys
import time
from pathlib import Path

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
gi.require_version("GstRtsp", "1.0")
from gi.repository import GLib, Gst, GstRtsp, GstRtspServer  # noqa: E402

# what IP cameras send: Motion JPEG, or H.264 / H.265 with a key frame every second and no B-frames (a
# camera's low-latency profile), one parameter set per key frame so a reader that joins late can decode
ENCODERS = {
    "mjpeg": "rtpjpegpay name=pay0 pt=26",
    "h264": "jpegdec ! videoconvert ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} "
    "! video/x-h264,profile=main ! rtph264pay name=pay0 pt=96 config-interval=1",
    "h265": "jpegdec ! videoconvert ! x265enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} "
    "! rtph265pay name=pay0 pt=96 config-interval=1",
}


def main() -> None:
    port, frames, fps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(port)
    factory = GstRtspServer.RTSPMediaFactory()
    # the video's frames pushed in real time (a camera's pace: multifilesrc alone would push them as fast
    # as it can), each stamped when it is pushed
    codec = os.environ.get("RTSP_CODEC", "mjpeg")
    factory.set_launch(
        f"( appsrc name=src is-live=true do-timestamp=true format=time caps=image/jpeg,framerate={fps}/1 "
        f"! jpegparse ! {ENCODERS[codec].format(fps=fps)} )"
    )
    jpegs = [p.read_bytes() for p in sorted(Path(frames).glob("*.jpg"))]
    logged = os.environ.get("RTSP_PUSH_LOG")
    push_log = Path(logged).open("a", buffering=1) if logged else None  # noqa: SIM115 (open while serving)

    def configure(_factory: object, media: GstRtspServer.RTSPMedia) -> None:
        src = media.get_element().get_child_by_name("src")
        count = [0]

        def push() -> bool:
            data = jpegs[count[0] % len(jpegs)]
            if push_log is not None:
                push_log.write(f"{count[0] % len(jpegs)} {time.time():.6f}\n")
            count[0] += 1
            return src.emit("push-buffer", Gst.Buffer.new_wrapped(data)) == Gst.FlowReturn.OK

        GLib.timeout_add(max(1, 1000 // fps), push)

    factory.connect("media-configure", configure)
    only = os.environ.get("RTSP_TRANSPORTS")  # "tcp" or "udp": the one RTSP transport this camera offers
    if only:
        factory.set_protocols({"tcp": GstRtsp.RTSPLowerTrans.TCP, "udp": GstRtsp.RTSPLowerTrans.UDP}[only])
    factory.set_shared(True)
    if len(sys.argv) > 5:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, "user")
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(sys.argv[4], sys.argv[5]), token)
        server.set_auth(auth)
        permissions = GstRtspServer.RTSPPermissions()
        permissions.add_role_from_structure(
            Gst.Structure.new_from_string(
                "user, media.factory.access=(boolean)true, media.factory.construct=(boolean)true"
            )
        )
        factory.set_permissions(permissions)
    server.get_mount_points().add_factory("/cam", factory)
    if server.attach(None) == 0:
        sys.exit(f"cannot listen on port {port}")
    print("ready", flush=True)
    GLib.MainLoop().run()


if __name__ == "__main__":
    main()
