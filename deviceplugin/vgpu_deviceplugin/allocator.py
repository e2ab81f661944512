"""Allocate's I/O: read pods on this node, call the pure core, write annotations, report.

Calls are serialised (one lock): two concurrent Allocates would otherwise pick the same pod part.
A failed call, and the one that consumes a pod's last part, release the node lock (`hamivgpu`), as
the scheduler expects (a pod whose part no call consumes keeps it until the scheduler's lock
expires: a memory-only container's call that no pod explained, say). A call the kubelet gave up
(it went away: gRPC cancels the handler) puts back the part it consumed (`Taken`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from vgpu_formats.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    DEVICES_TO_ALLOCATE,
    VGPU_TIME,
)

from vgpu_deviceplugin import allocate
from vgpu_deviceplugin.allocate import AllocateError, Call, Plan, Pod, PodRef
from vgpu_deviceplugin.config import Flags
from vgpu_deviceplugin.kube import KubeClient, KubeError
from vgpu_deviceplugin.monitor.region import FILE_SIZE as REGION_SIZE
from vgpu_deviceplugin.pod_cache import PodCache
from vgpu_deviceplugin.state import PluginState

log = logging.getLogger(__name__)
# The region file is opened read-write by the container's processes, whose uid the plugin cannot
# know: world-writable, in a directory only the plugin writes (and never mounted).
REGION_FILE_MODE = 0o666
REGION_DIR_MODE = 0o755
SETTINGS_FILE_MODE = 0o644


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a call decided on a list of pods: `explained` False when the list cannot settle it (a
    memory call: decided again on a fresh list; there, answered empty); `plan` the answer to
    give, None for an empty one."""

    explained: bool
    plan: Plan | None


@dataclasses.dataclass(frozen=True)
class Taken:
    """The part a call is consuming, and what the call changed besides, to be put back when the
    kubelet gives the call up: restarted, it asks again for each container it holds no answer
    for (the answers it got are in its checkpoint), and that call must find the same part, not
    the pod's next one or none ("device request not found"). Set just before the swap."""

    ref: PodRef
    before: str  # devices-to-allocate before the swap
    after: str
    vgpu_time: str | None  # the pod's, which the success patch replaces
    memory_seen: int | None  # the pod's memory calls counted before the call (None: none)
    region_file: str  # the call's own (a name of its own): the next call's answer makes another


# How a call decides on a list of pods (the cache's, then a fresh one).
# `fresh`: the list is a fresh one, not the cache's.
Decide = Callable[[list[dict[str, Any]], bool], Awaitable[Outcome]]


class Allocator:
    def __init__(
        self,
        kube: KubeClient,
        state: PluginState,
        flags: Flags,
        cache: PodCache | None = None,
        cache_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self._cache = cache
        self._kube = kube
        self._state = state
        self._flags = flags
        self._cache_id = cache_id
        self._lock = asyncio.Lock()
        self._taken: Taken | None = None  # the call in progress's, once its swap is under way

    async def allocate(self, amount: int) -> Plan:
        """The count resource's Allocate of `amount` devices."""
        outcome = await self._guarded(f"{amount} device(s)", lambda pods, _: self._count_from(pods, amount))
        assert outcome.plan is not None  # a count call is answered or raises
        return outcome.plan

    async def allocate_memory(self, units: int) -> Plan | None:
        """The memory resource's Allocate of `units`: the answer for a memory-only container, or
        None (an empty answer: the count call answers the container, or no pod explains it)."""
        outcome = await self._guarded(f"{units} memory unit(s)",
                                      lambda pods, fresh: self._memory_from(pods, units, fresh))
        if not outcome.explained:
            # The plugin restarted in the middle of a pod's admission, say: a container asking
            # memory alone then runs without a share (and without libvgpu.so), as upstream.
            log.warning("a %s call of %d units that no pod on this node explains: answered empty",
                        self._state.settings.names.memory, units)
        return outcome.plan

    async def _guarded(self, what: str, decide: Decide) -> Outcome:
        """One call, serialised. A failed call releases the node lock, as does one that consumes
        its pod's last part."""
        async with self._lock:
            await self._after_put_back()
            self._taken = None
            try:
                outcome = await self._decide(decide)
                if outcome.plan is not None and outcome.plan.done:
                    await self._release_node_lock()
                return outcome
            except AllocateError as exc:
                log.error("Allocate of %s failed: %s", what, exc)
                self._admission_ended()
                if exc.pod is not None:
                    # Never again taken for a pod whose admission starts (decide_memory).
                    self._state.memory_seen.setdefault(exc.pod.uid, 0)
                    await self._mark_failed(exc.pod)
                await self._release_node_lock()
                raise
            except asyncio.CancelledError:
                # The kubelet went away mid-call (gRPC cancels the handler): the answer never
                # reaches it. The part goes back and the lock still goes, whatever cancels next;
                # the next call, of this allocator or of the one a restart makes, waits for it.
                self._admission_ended()
                self._state.putting_back = asyncio.ensure_future(self._went_away(self._taken))
                await asyncio.shield(self._state.putting_back)
                raise
            except Exception as exc:
                # A bug or a value no check foresaw must not leave the node locked for every
                # later pod: report it as this call's error and release the lock.
                log.exception("Allocate of %s failed unexpectedly", what)
                self._admission_ended()
                await self._release_node_lock()
                raise AllocateError(f"unexpected error while allocating {what}: "
                                    f"{exc!r}; see the device plugin's log") from exc

    async def _after_put_back(self) -> None:
        """Waits for the put-back of a call given up before this one, which may still be at it
        (a second cancel ended its handler, or a kubelet restart replaced its allocator)."""
        pending = self._state.putting_back
        if pending is None:
            return
        try:
            await asyncio.shield(pending)
        except Exception:
            log.exception("putting back the part of a call the kubelet gave up failed")
        if self._state.putting_back is pending:
            self._state.putting_back = None

    async def _went_away(self, taken: Taken | None) -> None:
        try:
            if taken is not None:
                await self._give_back(taken)
        finally:
            await self._release_node_lock()  # whatever the put-back met

    async def _give_back(self, taken: Taken) -> None:
        """Puts a given-up call's part back, then the pod's bind-phase and vgpu-time as the call
        found them, its memory count, and removes the call's region file."""
        ref = taken.ref
        pod = await self._part_back(taken)
        if pod is None:
            return
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        # Written whether or not success shows: a success patch in flight when the call was given
        # up may land after the swap's reply.
        back = {BIND_PHASE: BIND_PHASE_ALLOCATING, VGPU_TIME: taken.vgpu_time}
        try:
            await self._kube.patch_pod(ref.namespace, ref.name, {"metadata": {"annotations": back}})
            annotations.update(back)
        except KubeError as exc:
            log.error("pod %s: cannot write bind-phase %s back: %s", ref, BIND_PHASE_ALLOCATING, exc)
        if taken.memory_seen is None:
            self._state.memory_seen.pop(ref.uid, None)
        else:
            self._state.memory_seen[ref.uid] = taken.memory_seen
        if self._cache is not None:
            self._cache.put(dict(pod))
        # Never mounted (the kubelet has no answer naming it); the monitor reads one region a folder.
        try:
            os.unlink(taken.region_file)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("pod %s: cannot remove %s, which no answer mounts: %s", ref, taken.region_file, exc)
        log.warning("pod %s: the kubelet gave up the call before its answer reached it; the part "
                    "is put back for the kubelet's next call", ref)

    async def _part_back(self, taken: Taken) -> Pod | None:
        """The reverse compare-and-swap; an unclear failure is read back, as `_swap` does. The pod
        with its part back, or None (the swap never took, the pod is gone, or it cannot be put
        back: logged)."""
        ref = taken.ref
        try:
            return await self._kube.consume_devices(ref.namespace, ref.name, taken.after, taken.before)
        except KubeError as exc:
            if exc.status in (404, 422):  # gone, or the swap never took (or the pod moved on)
                log.info("pod %s: a call given up by the kubelet had consumed nothing: %s", ref, exc)
                return None
            failed = f"pod {ref}: cannot put back the part of a call the kubelet gave up: {exc}"
        try:
            pod = await self._read_back(ref, failed)
        except AllocateError as unread:
            pod, failed = None, str(unread)
        if pod is not None and _devices_of(pod) == taken.before:
            return pod
        log.error("%s; the kubelet's next call for this container will not find its part", failed)
        return None

    async def _decide(self, decide: Decide) -> Outcome:
        cached = self._cache.pods() if self._cache is not None else None
        if self._cache is not None and cached is not None:
            self._forget(self._cache.deleted())
            try:
                outcome = await decide(cached, False)
                if outcome.explained:
                    return outcome
                # A memory call the cache cannot settle: looked at on a fresh list.
            except AllocateError as exc:
                # The cache may lag behind the scheduler (pod missing, or changed under the
                # compare-and-swap): decide again, once, on a fresh list. Not after a swap that
                # took: that pod's part is consumed, and is this call's.
                if exc.final:
                    raise
        node = self._state.settings.node_name
        try:
            pods = await self._kube.list_pods_on_node(node)
        except KubeError as exc:
            raise AllocateError(f"cannot list pods on node {node}: {exc}") from exc
        present = {p.get("metadata", {}).get("uid") for p in pods}
        self._forget({u for u in self._state.served_uids() if u not in present})
        return await decide(pods, True)

    def _forget(self, uids: set[str]) -> None:
        """Forgets the call counts of pods that left the node (a fresh list lacks them, or the pod
        cache saw them deleted; a pod the cache has not seen yet keeps its counts), and only
        those: an init call takes no swap, so the count is all that tells a served init
        container from one to serve, in an older version of the pod that the watch may still
        deliver (dropped when the pod was done or failed, that version's init container answered
        another pod's call); a memory call follows the count call that finished its pod."""
        for uid in uids:
            self._state.init_served.pop(uid, None)
            self._state.memory_seen.pop(uid, None)

    def _admission_ended(self) -> None:
        """The kubelet gives up the pod under admission after a failed call: the next call
        starts another."""
        self._state.last_pod = None
        self._state.deferred = None

    async def _count_from(self, pods: list[dict[str, Any]], amount: int) -> Outcome:
        state = self._state
        ref, pod, call = allocate.select(pods, state.settings.node_name, amount, state.settings.names,
                                         state.init_served)
        result = await self._answer(ref, pod, call)
        seen = state.memory_seen.get(ref.uid, 0)
        state.memory_seen[ref.uid] = allocate.memory_seen_after(pod, state.settings.names, call, seen,
                                                                state.deferred)
        state.deferred = None
        state.last_pod = ref.uid
        return Outcome(True, result)

    async def _memory_from(self, pods: list[dict[str, Any]], units: int, fresh: bool) -> Outcome:
        """`fresh`: `pods` is a fresh list, not the cache's."""
        state = self._state
        decision = allocate.decide_memory(pods, state.settings.node_name, units, state.settings.names,
                                          state.memory_seen, state.last_pod)
        if not fresh and (decision.ref is None or decision.unstarted):
            # Only the pod under admission is taken from the cache: the pods that may start
            # an admission are counted on a fresh list (a cache that lags may not show the one
            # the kubelet admits, and the call then looked like another's, or like nobody's).
            return Outcome(False, None)
        if decision.ref is None or decision.pod is None or decision.use is None:
            # Deferred: the count call that follows counts it.
            state.deferred = decision.deferred
            return Outcome(decision.deferred is not None, None)
        ref, use = decision.ref, decision.use
        result = None if decision.call is None else await self._answer(ref, decision.pod, decision.call)
        if result is None and not use.counted:
            log.warning("pod %s: container %s asks for %s alone and holds no GPU part in %s: "
                        "answered without a GPU", ref, use.container, state.settings.names.memory,
                        DEVICES_TO_ALLOCATE)
        state.memory_seen[ref.uid] = state.memory_seen.get(ref.uid, 0) + 1
        state.deferred = None
        state.last_pod = ref.uid
        return Outcome(True, result)

    async def _swap(self, ref: PodRef, old: str, new: str, phase: str | None) -> dict[str, Any]:
        """Consumes the call's part: the pod's devices-to-allocate from `old` to `new` by
        compare-and-swap (and, given `phase`, only while the pod is in it); the updated pod.

        Refused at once (422: changed under it, 409, 404: gone), the swap did not take, and the
        call may be decided again on a fresh list (a stale cache). Any other failure (a timeout,
        a reset connection, a 5xx) may come after the server applied it, or before it applies
        it late: deciding again would find this pod's part consumed and give this container the
        next waiting pod's part. So the pod is read back: its part consumed, the swap took and
        the call is answered with it; its part still there, the same swap is made once more
        (the compare lets only one of the two take); anything else, or no reading, fails the
        call, deciding nothing again."""
        attempts = 2
        for attempt in range(1, attempts + 1):
            try:
                return await self._kube.consume_devices(ref.namespace, ref.name, old, new, phase)
            except KubeError as exc:
                failed = f"pod {ref}: cannot update its annotations: {exc}"
                if attempt == 1 and exc.status in (404, 409, 422):
                    raise AllocateError(failed, ref) from exc
                pod = await self._read_back(ref, failed)
                if pod is not None and _devices_of(pod) == new:
                    log.warning("%s; read back, it took: the call is answered with that part", failed)
                    return dict(pod)
                if _devices_of(pod) != old or attempt == attempts:
                    raise AllocateError(f"{failed}; read back, its {DEVICES_TO_ALLOCATE} is not the "
                                        "value after the swap", ref, final=True) from exc
                log.warning("%s; read back, it did not take: swapping again", failed)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _read_back(self, ref: PodRef, failed: str) -> Pod | None:
        """The pod as a fresh list shows it (None: gone); a failed list fails the call for good."""
        try:
            pods = await self._kube.list_pods_on_node(self._state.settings.node_name)
        except KubeError as again:
            raise AllocateError(f"{failed}; nor read it back to see whether it took: {again}",
                                ref, final=True) from again
        return next((p for p in pods if (p.get("metadata") or {}).get("uid") == ref.uid), None)

    async def _answer(self, ref: PodRef, pod: Pod, call: Call) -> Plan:
        """Plans `call`, consumes its part (compare-and-swap) and writes the container's files."""
        state, flags = self._state, self._flags
        result = allocate.plan(pod, ref, call, state.settings, state.healthy_memory, flags.hook_path,
                               flags.cache_root, self._cache_id(), flags.allow_disable_control)
        # The upstream flags that change the answer's form (plan() checked every uuid is here).
        gpus = {g.uuid: g for g in state.gpus}
        if flags.device_id_strategy == "index":
            index_of = {u: g.index for u, g in gpus.items()}
            envs = {**result.envs, "NVIDIA_VISIBLE_DEVICES": allocate.visible_devices(call.devices, index_of)}
            result = dataclasses.replace(result, envs=envs)
        if flags.pass_device_specs:
            specs = allocate.device_specs([gpus[d.uuid].minor for d in call.devices], os.path.exists)
            result = dataclasses.replace(result, device_specs=specs)
        if call.is_init:
            _write_files(ref, result)
            state.init_served[ref.uid] = state.init_served.get(ref.uid, 0) + 1
        else:
            assert result.devices_to_allocate is not None
            old = pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE]
            # The phase read must hold too: the pod cache may not show yet that the kubelet
            # rejected the pod (its status is written asynchronously), and a stale 422 decides
            # again on a fresh list, where the pod is no candidate.
            phase = (pod.get("status") or {}).get("phase")
            self._taken = Taken(ref, old, result.devices_to_allocate,
                                pod["metadata"]["annotations"].get(VGPU_TIME),
                                state.memory_seen.get(ref.uid), result.cache_file)
            try:
                updated = await self._swap(ref, old, result.devices_to_allocate, phase)
            except AllocateError:
                self._taken = None  # it did not take; a decision on a fresh list may follow
                raise
            if self._cache is not None:
                self._cache.put(updated)
            # After the swap, not before: a decision on a stale cache names a container already
            # answered, whose swap fails; its files (the settings file naming its region) stay.
            _write_files(ref, result, final=True)
            if result.done:
                try:
                    await self._kube.patch_pod(ref.namespace, ref.name, allocate.success_patch())
                except KubeError as exc:
                    # The devices are consumed and the answer is valid: report, do not fail the pod.
                    log.error("pod %s: cannot write bind-phase success: %s", ref, exc)
        log.info("Allocate: pod %s container %s gets %s", ref, call.container,
                 result.envs["NVIDIA_VISIBLE_DEVICES"])
        return result

    async def _mark_failed(self, ref: PodRef) -> None:
        try:
            await self._kube.patch_pod(ref.namespace, ref.name, allocate.failed_patch())
        except KubeError as exc:
            log.error("cannot mark pod %s failed: %s", ref, exc)

    async def _release_node_lock(self) -> None:
        node = self._state.settings.node_name
        try:
            await self._kube.patch_node(node, allocate.release_lock_patch())
        except KubeError as exc:
            log.error("cannot release the node lock on %s: %s", node, exc)


def _devices_of(pod: Pod | None) -> str | None:
    """The pod's devices-to-allocate as read back (None: no pod, or no such annotation)."""
    return (((pod or {}).get("metadata") or {}).get("annotations") or {}).get(DEVICES_TO_ALLOCATE)


def _write_files(ref: PodRef, result: Plan, final: bool = False) -> None:
    """The container's settings file and empty region file, which its answer mounts. `final`: the
    pod's part is consumed already (the error ends the call, and fails the pod)."""
    try:
        write_settings_file(result.settings_file, result.settings_text)
        make_region_file(result.cache_file)
    except OSError as exc:
        raise AllocateError(f"pod {ref}: cannot create {exc.filename or result.cache_dir}: "
                            f"{exc.strerror or exc}", ref, final) from exc


def _container_dir(path: str) -> str:
    """The folder of a container's files (`path` is one of them), made and given its mode."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    # chmod, not makedirs' mode: the umask does not apply; also narrows a 1777 directory left by
    # an older plugin.
    os.chmod(directory, REGION_DIR_MODE)
    return directory


def write_settings_file(path: str, text: str) -> None:
    """The container's settings file, replaced whole and durably: written to a temporary file,
    synced, renamed over it, the folder synced. A reader (or a container restarted after a node
    crash, from the kubelet's saved answer) sees the old or the new file, never an empty or half
    one. 0644: libvgpu.so refuses one that group or others could write."""
    directory = _container_dir(path)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                     SETTINGS_FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(fd, SETTINGS_FILE_MODE)  # the umask narrowed the mode given to open()
            out.write(text.encode())
            out.flush()
            os.fsync(fd)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def make_region_file(path: str) -> None:
    """The container's region file, at the region's size and all zeros (sparse: no disk used until
    written). libvgpu.so fills in the header on first use (a zero magic means "not written yet"
    to it and to the monitor alike), exactly as for a file it created itself."""
    _container_dir(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, REGION_FILE_MODE)
    try:
        if os.fstat(fd).st_size < REGION_SIZE:
            os.ftruncate(fd, REGION_SIZE)
        os.fchmod(fd, REGION_FILE_MODE)  # the umask narrowed the mode given to open()
    finally:
        os.close(fd)
