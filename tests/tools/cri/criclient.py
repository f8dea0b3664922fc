#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A Kubernetes CRI client for ferry's tests (tests/e2e/cri.sh): what
kubelet asks of its image and runtime services, over a unix socket, with
the messages of cri.proto (compiled with protoc at start).

  criclient.py -socket SOCK version
  criclient.py -socket SOCK pull IMAGE [-user USER:PASS] [-server ADDR]
      PullImage, the credentials only in the request's AuthConfig (as
      kubelet sends a pull secret); prints the image's id.
  criclient.py -socket SOCK run IMAGE -logs DIR [-name NAME] -- CMD...
      RunPodSandbox (host network: no CNI), CreateContainer of IMAGE
      running CMD, StartContainer, until it exits; prints what it wrote
      (from its CRI log), stops and removes container and sandbox as
      kubelet does when the pod goes, and exits with the container's
      status.
  criclient.py -socket SOCK status IMAGE
      ImageStatus: the image's id, then its names (repo tags and digests)
      as the CRI plugin stores them, one a line; exits 1 if it has none.
"""
import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_MSG = 16 << 20  # kubelet's limit


def load_messages():
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(["protoc", "-I", HERE, "--python_out", out,
                        os.path.join(HERE, "cri.proto")], check=True)
        sys.path.insert(0, out)
        try:
            return importlib.import_module("cri_pb2")
        finally:
            sys.path.remove(out)


class CRI:
    def __init__(self, socket, timeout):
        self.pb = load_messages()
        self.timeout = timeout
        self.channel = grpc.insecure_channel(
            "unix://" + socket,
            options=[("grpc.max_receive_message_length", MAX_MSG),
                     ("grpc.max_send_message_length", MAX_MSG)])

    def call(self, service, method, request):
        reply = getattr(self.pb, method + "Response")
        rpc = self.channel.unary_unary(
            "/runtime.v1.%s/%s" % (service, method),
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=reply.FromString)
        return rpc(request, timeout=self.timeout)

    def image(self, method, request):
        return self.call("ImageService", method, request)

    def runtime(self, method, request):
        return self.call("RuntimeService", method, request)


def cmd_version(cri, _args):
    v = cri.runtime("Version", cri.pb.VersionRequest(version="v1"))
    print(v.runtime_name, v.runtime_version, v.runtime_api_version)


def cmd_pull(cri, args):
    pb = cri.pb
    req = pb.PullImageRequest(image=pb.ImageSpec(image=args.image))
    if args.user:
        user, _, password = args.user.partition(":")
        req.auth.username = user
        req.auth.password = password
    if args.server:
        req.auth.server_address = args.server
    print(cri.image("PullImage", req).image_ref)


def cmd_status(cri, args):
    img = cri.image("ImageStatus", cri.pb.ImageStatusRequest(
        image=cri.pb.ImageSpec(image=args.image))).image
    if not img.id:
        sys.exit("criclient: status: no image %s" % args.image)
    print(img.id)
    for name in list(img.repo_tags) + list(img.repo_digests):
        print(name)


def sandbox_config(pb, name, logs):
    ns = pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER, ipc=pb.POD)
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=name + "-uid",
                                       namespace="ferry-e2e"),
        log_directory=logs,
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)))


def log_text(path):
    """The container's output from its CRI log: TIME STREAM P|F TEXT."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 3)
            if len(parts) < 3:
                continue
            text = parts[3] if len(parts) == 4 else ""
            out.append(text if parts[2] == "P" else text + "\n")
    return "".join(out)


def cmd_run(cri, args):
    pb = cri.pb
    cfg = sandbox_config(pb, args.name, args.logs)
    sandbox = cri.runtime("RunPodSandbox", pb.RunPodSandboxRequest(config=cfg)).pod_sandbox_id
    container = None
    try:
        ccfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=args.name),
            image=pb.ImageSpec(image=args.image),
            command=args.cmd, log_path=args.name + ".log")
        container = cri.runtime("CreateContainer", pb.CreateContainerRequest(
            pod_sandbox_id=sandbox, config=ccfg, sandbox_config=cfg)).container_id
        cri.runtime("StartContainer", pb.StartContainerRequest(container_id=container))
        deadline = time.monotonic() + cri.timeout
        while True:
            st = cri.runtime("ContainerStatus",
                             pb.ContainerStatusRequest(container_id=container)).status
            if st.state == pb.CONTAINER_EXITED:
                break
            if time.monotonic() > deadline:
                sys.exit("criclient: container %s still running after %d s" %
                         (container, cri.timeout))
            time.sleep(0.2)
        sys.stdout.write(log_text(os.path.join(args.logs, args.name + ".log")))
        if st.exit_code:
            print("criclient: container exited %d (%s %s)" % (st.exit_code, st.reason, st.message),
                  file=sys.stderr)
        return st.exit_code
    finally:
        if container:
            cri.runtime("StopContainer", pb.StopContainerRequest(container_id=container,
                                                                 timeout=10))
            cri.runtime("RemoveContainer", pb.RemoveContainerRequest(container_id=container))
        cri.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox))
        cri.runtime("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-socket", required=True)
    p.add_argument("-timeout", type=int, default=120)
    sub = p.add_subparsers(dest="op", required=True)
    sub.add_parser("version")
    s = sub.add_parser("pull")
    s.add_argument("image")
    s.add_argument("-user", help="USER:PASS, sent in the AuthConfig")
    s.add_argument("-server", help="the AuthConfig's server_address")
    s = sub.add_parser("status")
    s.add_argument("image")
    s = sub.add_parser("run")
    s.add_argument("image")
    s.add_argument("-logs", required=True, help="the sandbox's log directory")
    s.add_argument("-name", default="ferry")
    s.add_argument("cmd", nargs="+")
    args = p.parse_args()
    cri = CRI(args.socket, args.timeout)
    try:
        rc = {"version": cmd_version, "pull": cmd_pull, "status": cmd_status,
              "run": cmd_run}[args.op](cri, args)
    except grpc.RpcError as e:
        sys.exit("criclient: %s: %s: %s" % (args.op, e.code().name, e.details()))
    sys.exit(rc or 0)


if __name__ == "__main__":
    main()
