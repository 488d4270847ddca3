"""A kubelet device plugin (API v1beta1) for the cluster tests, standing in for NVIDIA's
k8s-device-plugin: it registers resources whose devices are the simulated host's GPUs or
MIG devices (by UUID) and answers Allocate the way that plugin does for each
``deviceListStrategy`` (FACTS §11):

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<ids>`` in the container's environment;
- ``volume-mounts``: ``/dev/null`` mounted at ``/var/run/nvidia-container-devices/<id>``
  (and ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices``);
- ``cdi-annotations``: the container annotation ``cdi.k8s.io/nvidia-device-plugin_<uuid>``
  naming ``k8s.device-plugin.nvidia.com/gpu=<id>`` (names of the spec the real plugin
  writes; this stand-in writes none, so a runtime has nothing to resolve them in).

Each form is held to the real plugin's answer (v0.20.0, ../shared/nvidia) by
tests/test_k8s_nvidia_plugin.py, which compares ``allocation`` with what the kubelet
kept of the real plugin's Allocate.

The messages are built from descriptors here (no generated code, no protoc); gRPC is the
real library over the kubelet's real sockets.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

VERSION = "v1beta1"
DEVICES_DIR = "/var/run/nvidia-container-devices"
STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations")
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"  # the real plugin's spec's kind
CDI_ANNOTATION = "cdi.k8s.io/nvidia-device-plugin_"

_F = descriptor_pb2.FieldDescriptorProto
_MESSAGES = {
    "Empty": [],
    "DevicePluginOptions": [
        ("pre_start_required", 1, _F.TYPE_BOOL, False, None),
        ("get_preferred_allocation_available", 2, _F.TYPE_BOOL, False, None),
    ],
    "RegisterRequest": [
        ("version", 1, _F.TYPE_STRING, False, None),
        ("endpoint", 2, _F.TYPE_STRING, False, None),
        ("resource_name", 3, _F.TYPE_STRING, False, None),
        ("options", 4, _F.TYPE_MESSAGE, False, "DevicePluginOptions"),
    ],
    "Device": [
        ("ID", 1, _F.TYPE_STRING, False, None),
        ("health", 2, _F.TYPE_STRING, False, None),
    ],
    "ListAndWatchResponse": [("devices", 1, _F.TYPE_MESSAGE, True, "Device")],
    "ContainerAllocateRequest": [("devices_ids", 1, _F.TYPE_STRING, True, None)],
    "AllocateRequest": [
        ("container_requests", 1, _F.TYPE_MESSAGE, True, "ContainerAllocateRequest")
    ],
    "Mount": [
        ("container_path", 1, _F.TYPE_STRING, False, None),
        ("host_path", 2, _F.TYPE_STRING, False, None),
        ("read_only", 3, _F.TYPE_BOOL, False, None),
    ],
    "ContainerAllocateResponse": [
        ("envs", 1, _F.TYPE_MESSAGE, True, "ContainerAllocateResponse.EnvsEntry"),
        ("mounts", 2, _F.TYPE_MESSAGE, True, "Mount"),
        ("annotations", 4, _F.TYPE_MESSAGE, True, "ContainerAllocateResponse.AnnotationsEntry"),
    ],
    "AllocateResponse": [
        ("container_responses", 1, _F.TYPE_MESSAGE, True, "ContainerAllocateResponse")
    ],
    "PreStartContainerRequest": [("devices_ids", 1, _F.TYPE_STRING, True, None)],
    "PreStartContainerResponse": [],
}


def _classes() -> dict[str, type]:
    """The v1beta1 message classes (the kubelet's field numbers)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="nvshim_test_deviceplugin.proto", package=VERSION, syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        msg = proto.message_type.add(name=name)
        for field_name, number, kind, repeated, type_name in fields:
            field = msg.field.add(name=field_name, number=number, type=kind)
            field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if type_name:
                field.type_name = f".{VERSION}.{type_name}"
        if name == "ContainerAllocateResponse":
            for entry in ("EnvsEntry", "AnnotationsEntry"):
                nested = msg.nested_type.add(name=entry)
                nested.options.map_entry = True
                for field_name, number in (("key", 1), ("value", 2)):
                    nested.field.add(
                        name=field_name,
                        number=number,
                        type=_F.TYPE_STRING,
                        label=_F.LABEL_OPTIONAL,
                    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{VERSION}.{name}"))
        for name in _MESSAGES
    }


M = _classes()


def allocation(strategy: str, ids: list[str], serial: int) -> object:
    """One container's AllocateResponse part, as NVIDIA's plugin makes it."""
    out = M["ContainerAllocateResponse"]()
    if strategy == "envvar":
        out.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
    elif strategy == "volume-mounts":
        out.envs["NVIDIA_VISIBLE_DEVICES"] = DEVICES_DIR
        for device in ids:
            out.mounts.add(
                container_path=f"{DEVICES_DIR}/{device}", host_path="/dev/null"
            )  # read-write, as the real plugin mounts it
    elif strategy == "cdi-annotations":
        import uuid

        names = ",".join(f"{CDI_KIND}={device}" for device in ids)
        out.annotations[f"{CDI_ANNOTATION}{uuid.uuid4()}"] = names
    else:
        raise ValueError(strategy)
    return out


def _unary(fn, request: str, response: str):
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=M[request].FromString,
        response_serializer=M[response].SerializeToString,
    )


class Plugin:
    """One resource served on ``plugin_dir/<socket>`` and registered with the kubelet
    (``plugin_dir/kubelet.sock``); re-registers when the kubelet restarts (its socket
    is recreated)."""

    def __init__(self, plugin_dir: str, resource: str, strategy: str, ids: list[str]) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(strategy)
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.strategy = strategy
        self.ids = list(ids)
        self.socket = f"nvshim-test-{resource.replace('/', '-').replace('.', '-')}.sock"
        self.allocated: list[list[str]] = []
        self._serial = 0
        self._stop = threading.Event()
        self._server: grpc.Server | None = None

    # the DevicePlugin service
    def _options(self, _request, _context):
        return M["DevicePluginOptions"]()

    def _list_and_watch(self, _request, context):
        devices = [M["Device"](ID=i, health="Healthy") for i in self.ids]
        yield M["ListAndWatchResponse"](devices=devices)
        while not self._stop.wait(0.5) and context.is_active():
            pass

    def _allocate(self, request, _context):
        response = M["AllocateResponse"]()
        for container in request.container_requests:
            self._serial += 1
            ids = list(container.devices_ids)
            self.allocated.append(ids)
            response.container_responses.append(allocation(self.strategy, ids, self._serial))
        return response

    def _pre_start(self, _request, _context):
        return M["PreStartContainerResponse"]()

    def start(self) -> Plugin:
        path = os.path.join(self.plugin_dir, self.socket)
        if os.path.exists(path):
            os.unlink(path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "GetDevicePluginOptions": _unary(self._options, "Empty", "DevicePluginOptions"),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self._list_and_watch,
                request_deserializer=M["Empty"].FromString,
                response_serializer=M["ListAndWatchResponse"].SerializeToString,
            ),
            "Allocate": _unary(self._allocate, "AllocateRequest", "AllocateResponse"),
            "PreStartContainer": _unary(
                self._pre_start, "PreStartContainerRequest", "PreStartContainerResponse"
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(f"{VERSION}.DevicePlugin", handlers),)
        )
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self._server = server
        self.register()
        return self

    def register(self, timeout: float = 30.0) -> None:
        kubelet = os.path.join(self.plugin_dir, "kubelet.sock")
        deadline = time.monotonic() + timeout
        while not os.path.exists(kubelet):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kubelet}: the kubelet's registration socket never came")
            time.sleep(0.1)
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            register = channel.unary_unary(
                f"/{VERSION}.Registration/Register",
                request_serializer=M["RegisterRequest"].SerializeToString,
                response_deserializer=M["Empty"].FromString,
            )
            register(
                M["RegisterRequest"](
                    version=VERSION,
                    endpoint=self.socket,
                    resource_name=self.resource,
                    options=M["DevicePluginOptions"](),
                ),
                timeout=timeout,
            )

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(1).wait()
            self._server = None
        path = os.path.join(self.plugin_dir, self.socket)
        if os.path.exists(path):
            os.unlink(path)
