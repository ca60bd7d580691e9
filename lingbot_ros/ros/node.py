"""map_node: the lifecycle node that runs the Mapper on a camera topic. ROS wiring only.

Lifecycle (rclpy.lifecycle):
  configure   validate parameters (FAILURE, naming them), load the model, warm it up on the
              worker (ERROR if either fails; on_error then releases everything), create
              publishers, services, timers and TF output.
  activate    check the input parameters (FAILURE, naming them), subscribe. The stream resumes
              exactly where it stopped: no warm-up, no restart (a long pause may still end in an
              announced restart through max_stamp_gap_s).
  deactivate  unsubscribe; frames still waiting are dropped and counted. The Mapper is kept.
  cleanup     stop the worker, free the model and its memory (CUDA cache emptied).
With ``autostart`` (default) ros/main.py configures and activates at start-up.

Threads: image callbacks (one mutually exclusive group) decode and hand frames to the worker;
side inputs (odometry, TF, camera_info) have groups of their own, the high-rate ones drained in
batches (ros/tap.py); service callbacks (another group) queue work to the worker and wait for it;
the worker is the only thread that touches the Mapper; status and diagnostics read its immutable
snapshot. Every callback runs under the safety net (ros/safety.py); what enters is checked at
the boundary first (ros/input_checks.py, ros/params.py).

A camera rig (``cameras``; ros/rig.py): each camera's image callbacks (a group each) feed one
GroupInbox, the worker runs its groups through the RigMapper (the node's ``mapper`` is then a
RigFront); the primary camera is what the single camera's topics, TF and services see.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.lifecycle import Node as LifecycleNode
from rclpy.lifecycle import State, TransitionCallbackReturn

from lingbot_ros.mapping import factory
from lingbot_ros.mapping.mapper import Mapper
from lingbot_ros.mapping.records import FAILED, REJECTED, InputFrame
from lingbot_ros.mapping.rig.cameras import check_rig_settings
from lingbot_ros.mapping.rig.grouping import MAX_CAMERAS
from lingbot_ros.mapping.rig.rig_mapper import RigMapper
from lingbot_ros.mapping.settings import MapperSettings, SettingsError
from lingbot_ros.mapping.warmup_size import AUTO, warmup_size
from lingbot_ros.ros import camera_info_size, messages, params, services
from lingbot_ros.ros.cameras import expected_types, wrong_types
from lingbot_ros.ros.diagnostics import Counters, Fanout
from lingbot_ros.ros.group_inbox import GroupInbox
from lingbot_ros.ros.health import Facts, Health, Limits
from lingbot_ros.ros.input_checks import ImageClock
from lingbot_ros.ros.inputs import BAD_INPUT_LOG_PERIOD_S, Inputs
from lingbot_ros.ros.output_thread import OutputThread, to_host
from lingbot_ros.ros.outputs import MapStatus, Outputs, PathCache
from lingbot_ros.ros.rig import CameraOutputs, RigFront, camera_lines, camera_summary, labelled
from lingbot_ros.ros.robot_link import RobotLink
from lingbot_ros.ros.safety import SafetyNet
from lingbot_ros.ros.status import diagnostic_array, fill_status, totals
from lingbot_ros.ros.worker import FrameInbox, Worker
from lingbot_ros.viewer.live_view import LiveView, ViewerError

# On a machine that has never run the model on CUDA, the warm-up JIT-compiles FlashInfer's
# kernels and torch.compile's (over a minute on an H200); later starts reuse the disk caches.
WARMUP_TIMEOUT_S = 900.0


class MapNode(LifecycleNode):
    def __init__(self, **kwargs):
        # Not _services/_subscriptions/_timers: rclpy.Node owns those names.
        self.mapper: Mapper | None = None
        self.bundle = None
        self.worker: Worker | None = None
        self.output_thread: OutputThread | None = None
        self.outputs: Outputs | None = None
        self.path: PathCache | None = None
        self.inputs: Inputs | None = None
        # A camera rig (parameter cameras; empty: none of these): per camera its inputs, counters, topics.
        self.camera_inputs: dict[str, Inputs] = {}
        self.camera_counters: dict[str, Counters] = {}
        self.camera_outputs: dict[str, CameraOutputs] = {}
        self._scales_pending = threading.Event()   # one refresh of the rig's scales queued at most
        self._camera_groups: dict[str, MutuallyExclusiveCallbackGroup] = {}   # each camera's image callbacks
        self.cfg: params.NodeSettings | None = None
        self.counters = Counters()
        self.health = Health()
        self.configure_error = ""   # why the last configure failed: /diagnostics says so until one succeeds
        self._logged_database_error = ""   # the map database problem last logged (once each)
        self._own_services: list = []
        self._own_timers: list = []
        self.robot: RobotLink | None = None
        self.viewer: LiveView | None = None
        self._viewer_refusal = ""   # why viewer_port is not served: a standing WARN in /diagnostics
        # Held by timer-thread users of the publishers (status, the map timer) and while cleanup
        # destroys them: rclpy raises InvalidHandle on a destroyed publisher and the executor's
        # spin_once re-raises it in main, which killed the node.
        self._outputs_lock = threading.Lock()
        super().__init__("map_node", **kwargs)
        self.safety = SafetyNet(self.get_logger(), lambda text: self.counters.refused("callback_errors", text))
        self.image_clock = ImageClock(lambda: self.get_clock().now().nanoseconds)
        self._qos_warnings: dict[str, str] = {}   # topic -> why its publisher delivers nothing
        self._map_publish_pending = threading.Event()   # one ~/map publication queued at most
        self.refused_parameters = params.declare(self)   # start-up values out of range
        self._image_group = MutuallyExclusiveCallbackGroup()
        self._service_group = MutuallyExclusiveCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        # /diagnostics reports in every state, unconfigured included (a failed configure is an ERROR).
        self._diagnostics = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diagnostics_timer = self.create_timer(
            params.NodeSettings.diagnostics_period_s, self.safety.guard("diagnostics timer", self._on_diagnostics_timer),
            callback_group=self._timer_group)
        if MapStatus is None:
            self.get_logger().warning(
                "lingbot_ros interfaces (MapStatus, SaveMap) are not built: status goes to /diagnostics "
                "only and ~/save_map is a std_srvs/Trigger writing to save_directory. Run "
                "scripts/setup.sh (venv) or colcon build to generate them.")

    def executor_threads(self) -> int:
        """Threads for the node's executor: 4, and one more per camera of a rig, whose image
        callbacks have a group each: a camera whose queue is full holds its callback's thread
        (back-pressure on its publisher) while the others, services and timers go on. A bad
        ``cameras`` value counts none here: configure refuses it."""
        cameras = self.get_parameter("cameras").value
        return 4 + (len(cameras) if isinstance(cameras, list) and len(cameras) <= MAX_CAMERAS else 0)

    # -- lifecycle ----------------------------------------------------------------------------

    def on_configure(self, state: State) -> TransitionCallbackReturn:
        """SUCCESS -> inactive; FAILURE (bad parameters) -> unconfigured; ERROR (load, warm-up)
        -> on_error, which releases everything -> unconfigured."""
        try:
            settings, self.cfg = params.read(self, self.refused_parameters)
            if self.cfg.cameras:
                settings = self._rig_settings(settings)
        except SettingsError as error:
            self.configure_error = f"configure failed, fix the parameters: {error}"
            self.get_logger().error(self.configure_error)
            return TransitionCallbackReturn.FAILURE
        try:
            self._diagnostics_timer.timer_period_ns = round(self.cfg.diagnostics_period_s * 1e9)
            self._qos_warnings.clear()
            self.counters = Counters()
            if self.cfg.cameras:
                self.bundle = factory.build_rig(settings, self.cfg.cameras)
                self.mapper = RigFront(RigMapper(settings, self.bundle, self.cfg.cameras, self.cfg.primary_camera))
                self.camera_counters = {camera: Counters() for camera in self.cfg.cameras}
                self.worker = Worker(GroupInbox(self.cfg.grouping()), self._handle_group, self._on_worker_error)
            else:
                self.bundle = factory.build(settings)
                self.mapper = Mapper(settings, self.bundle)
                self.worker = Worker(FrameInbox(False, 1), self._handle_frame, self._on_worker_error)
            self.worker.start()
            self.output_thread = OutputThread(self._on_worker_error)
            if self.bundle.random_weights:
                self.get_logger().warning(f"{self.bundle.untrained_warning()}; set the 'checkpoint' parameter "
                                          "for real output.")
            self.get_logger().info(f"loaded {self.bundle.description}")
            if settings.resume:
                self.get_logger().info(self.mapper.snapshot.state_text)
            if settings.warmup:
                self._warm_up(settings)
            self.outputs = Outputs.create(self)
            self.camera_outputs = {camera: CameraOutputs.create(self, camera) for camera in self.cfg.cameras}
            self.path = PathCache(self.mapper, self.cfg.map_frame, self.cfg.path_max_length)
            self._own_services = services.create(self, self._service_group)
            self._start_timers()
            cameras = ({camera: self.mapper.rig.camera(camera) for camera in self.cfg.cameras}
                       if self.cfg.cameras else None)
            self.robot = RobotLink(self, self.cfg, self.mapper, self.counters, self.image_clock, cameras)
            self._start_viewer()
        except Exception as error:   # any load or warm-up problem: report it, release, stay alive
            hint = factory.failure_hint(error, settings)
            self.configure_error = f"configure failed: {type(error).__name__}: {error}{hint}"
            self.get_logger().error(self.configure_error)
            return TransitionCallbackReturn.ERROR
        self.configure_error = ""
        self.publish_status()
        return TransitionCallbackReturn.SUCCESS

    def _rig_settings(self, settings: MapperSettings) -> MapperSettings:
        """A rig's settings, or SettingsError saying what to change: its cameras' topics carry
        images (ros/cameras.py), and what a rig refuses of the mapping settings (mapping/rig/cameras.py)."""
        errors = wrong_types(self.get_topic_names_and_types(),
                             expected_types(self, self.cfg.cameras, self.cfg.image_transport))
        if errors:
            raise SettingsError("; ".join(errors))
        check_rig_settings(settings)
        return settings

    def _warm_up(self, settings) -> None:
        """The warm-up on the images' size where it is known (mapping/warmup_size.py's rule)."""
        found = camera_info_size.found_image_size(self, self.cfg) if settings.warmup_image_size == AUTO else None
        size = warmup_size(settings, found, self.cfg.max_image_pixels)
        if size.warning:   # the camera_info was refused
            self.counters.refused("camera_info_rejected", size.warning)
            self.get_logger().warning(f"warm-up: {size.warning}; set warmup_image_size to the camera's WxH")
        self.get_logger().info(f"warming up on {size.describe()} (the first run on a machine compiles "
                               "kernels: a minute or more on CUDA)")
        seconds = self.worker.submit(self.mapper.warm_up, size).result(timeout=WARMUP_TIMEOUT_S)
        self.get_logger().info(f"warm-up done in {seconds:.1f} s")

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        """SUCCESS -> active (publishers on, subscribed); FAILURE (input parameters) -> inactive."""
        try:
            _, self.cfg = params.read(self, self.refused_parameters)
            errors = self.cfg.input_errors()
        except SettingsError as error:
            errors = [str(error)]
        if errors:
            self.get_logger().error("activate failed, fix the parameters: " + "; ".join(errors))
            return TransitionCallbackReturn.FAILURE
        order = "every frame, in order" if self.cfg.process_all_frames else "newest frame wins"
        if self.cfg.cameras:
            self._subscribe_rig()
            listening = ", ".join(inputs.image_topic for inputs in self.camera_inputs.values())
            order += f" per camera, grouped within {self.cfg.camera_sync_tolerance_s:g} s"
        else:
            self.worker.inbox = FrameInbox(self.cfg.process_all_frames, self.cfg.queue_size, InputFrame.after_dropped)
            self.inputs = Inputs(self, self.cfg, self.counters, self.worker.inbox.put, self._image_group)
            listening = self.inputs.image_topic
        self.get_logger().info(f"active: listening on {listening} ({order})")
        result = super().on_activate(state)   # switches the lifecycle publishers on
        self.publish_status()
        return result

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        """SUCCESS -> inactive: no subscriptions, publishers silent, the Mapper kept."""
        self._unsubscribe()
        self.worker.inbox.close()   # releases an image callback blocked on a full queue
        self.counters.add("dropped", self.worker.inbox.clear())
        result = super().on_deactivate(state)
        self.publish_status()
        return result

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        """SUCCESS -> unconfigured: worker stopped, model and caches freed."""
        self.release()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        self.release()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: State) -> TransitionCallbackReturn:
        """After an ERROR: release whatever the failed transition left, back to unconfigured."""
        self.release()
        return TransitionCallbackReturn.SUCCESS

    def release(self) -> None:
        """Undo configure (and activate), whatever state they got to. Idempotent."""
        self._unsubscribe()
        if self.worker is not None and not self.worker.stop(timeout=30.0):
            self.get_logger().error("the worker did not stop within 30 s (a model step is stuck)")
        if self.output_thread is not None and not self.output_thread.stop(timeout=10.0):
            self.get_logger().error("the output thread did not stop within 10 s")
        for timer in self._own_timers:
            self.destroy_timer(timer)
        for service in self._own_services:
            self.destroy_service(service)
        with self._outputs_lock:
            if self.outputs is not None:
                self.outputs.destroy()
            for outputs in self.camera_outputs.values():
                outputs.destroy()
            self.outputs, self.camera_outputs = None, {}
        if self.robot is not None:
            self.robot.destroy()
        if self.viewer is not None:
            self.viewer.close()
            self.viewer = None
        if self.mapper is not None:
            self.mapper.close()
        device = self.bundle.device if self.bundle is not None else "cpu"
        self._own_timers, self._own_services, self.robot = [], [], None
        self.worker = self.output_thread = self.path = self.mapper = self.bundle = None
        gc.collect()
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def _unsubscribe(self) -> None:
        if self.inputs is not None:
            self.inputs.destroy()
            self.inputs = None
        for inputs in self.camera_inputs.values():
            inputs.destroy()
        self.camera_inputs = {}

    def _subscribe_rig(self) -> None:
        """Each camera's inputs (~/<name>/image ...) into a new GroupInbox (its kind follows the
        input parameters, taken at activate), in a callback group of its own (executor_threads).
        A camera's frames and refusals count as its own and in the node's totals."""
        self.worker.inbox = inbox = GroupInbox(self.cfg.grouping())
        for camera in self.cfg.cameras:
            group = self._camera_groups.setdefault(camera, MutuallyExclusiveCallbackGroup())
            self.camera_inputs[camera] = Inputs(
                self, self.cfg, Fanout(self.counters, self.camera_counters[camera]),
                lambda frame, camera=camera: len(inbox.put(camera, frame)), group, camera)

    # -- worker side --------------------------------------------------------------------------

    def _handle_frame(self, frame: InputFrame) -> None:
        """The frame, and the frames that come while the device runs its step, through
        ``Mapper.process_queued``: a frame that comes then has its step queued before the one
        before is placed, so the device runs steps back to back while this thread places and
        publishes. Each frame's outputs are published as soon as it is placed."""
        fed: collections.deque[InputFrame] = collections.deque()

        def frames():
            coming = frame
            while coming is not None:
                self.robot.before_frame(coming)
                fed.append(coming)
                yield coming
                coming = self.worker.next_frame(lambda: self.mapper.step_running)

        with contextlib.closing(self.mapper.process_queued(frames())) as outcomes:
            for outcome in outcomes:
                self._publish_outcome(fed.popleft(), outcome)

    def _publish_outcome(self, frame: InputFrame, outcome) -> None:
        if outcome.taken is not None:   # what the stamp rule let in, not every message received
            self.image_clock.image(outcome.taken.stamp_ns, outcome.taken.received_ns)
        self.report(outcome.notices)
        if not self.context.ok():   # shutting down: nothing can be published any more
            return
        for output in outcome.new:
            self.outputs.poses(output, self.cfg, self.path)
            self.robot.publish(output)
        fields = self.outputs.image_fields()
        if fields and outcome.new:
            # One job per call: a phase-1 batch's frames are published together or not at all.
            copies = [to_host(output, fields) for output in outcome.new]
            self.output_thread.submit(self.safety.guard("image publication",
                                                        lambda: self._publish_images(copies, self._images)))
        if self.viewer is not None:
            self.viewer.update(self.mapper, outcome)
        self.counters.frame_done((time.monotonic_ns() - frame.received_ns) / 1e6)
        self.publish_status()

    def _images(self, output) -> None:
        self.outputs.images(output, self.cfg, self.mapper.settings.min_confidence)

    def _handle_group(self, group) -> None:
        """A rig's group (at most one frame per camera) as one batched step. Each camera's outputs
        go to its own topics; the primary camera's also to ~/pose, ~/odom, ~/path, TF and the
        single camera's image topics (~/points, ~/depth/image ...)."""
        for member in group:
            self.robot.before_frame(member.frame, member.camera)
        outcomes = self.mapper.process(group).outcomes
        primary = self.mapper.rig.primary
        taken = outcomes[primary].taken if primary in outcomes else None
        if taken is not None:   # the image clock (odometry's reference) follows the primary camera
            self.image_clock.image(taken.stamp_ns, taken.received_ns)
        self.report(labelled(outcomes).notices)
        if not self.context.ok():
            return
        for camera, outcome in outcomes.items():
            outputs = self.camera_outputs[camera]
            for output in outcome.new:
                outputs.poses(output, self.cfg)
                if camera == primary:
                    self.outputs.poses(output, self.cfg, self.path)
                    self.robot.publish(output)
            fields = set(outputs.image_fields()) | (set(self.outputs.image_fields()) if camera == primary else set())
            if fields and outcome.new:
                copies = [to_host(output, tuple(sorted(fields))) for output in outcome.new]

                def publish(output, outputs=outputs, camera=camera) -> None:
                    outputs.images(output, self.cfg)
                    if camera == primary:
                        self._images(output)
                self.output_thread.submit(self.safety.guard(
                    "image publication", lambda copies=copies, publish=publish: self._publish_images(copies, publish)))
        if self.viewer is not None and primary in outcomes:
            self.viewer.update(self.mapper.primary, outcomes[primary])
        now_ns = time.monotonic_ns()
        for member in group:
            latency_ms = (now_ns - member.frame.received_ns) / 1e6
            self.counters.frame_done(latency_ms)
            self.camera_counters[member.camera].frame_done(latency_ms)
        self.publish_status()

    def _publish_images(self, copies, publish) -> None:
        """On the output thread: once a frame's host copies are done, ``publish(output)`` its
        image-sized messages."""
        for output, copied in copies:
            if copied is not None:
                copied.synchronize()
            if self.context.ok():
                publish(output)

    def report(self, notices) -> None:
        logger = self.get_logger()
        for notice in notices:
            if notice.kind in (REJECTED, FAILED):
                # A rejected image's reason is the newest refusal of images (the Mapper counts it).
                self.counters.error(notice.text, "rejected" if notice.kind == REJECTED else "")
                log = logger.error if notice.kind == FAILED else logger.warning
                log(notice.text, throttle_duration_sec=BAD_INPUT_LOG_PERIOD_S)
            else:
                logger.warning(notice.text)

    def _on_worker_error(self, error: BaseException) -> None:
        if self.context.ok():
            self.get_logger().error(f"frame handling failed: {type(error).__name__}: {error}")

    def qos_mismatch(self, topic: str, event, hint: str = "") -> None:
        """A publisher of ``topic`` whose QoS cannot match ours (its messages never arrive)."""
        policy = getattr(event, "last_policy_kind", "")
        policy = getattr(policy, "name", policy)
        text = (f"{topic}: a publisher's QoS is incompatible with this subscription ({policy}; "
                f"{event.total_count} publisher(s) so far): its messages are not received{hint}")
        if self._qos_warnings.get(topic) != text:
            self.get_logger().warning(text)
        self._qos_warnings[topic] = text

    def input_warnings(self) -> tuple:
        """Standing input problems for /diagnostics (WARN, the topic named)."""
        warnings = list(self._qos_warnings.values())
        if self.robot is not None:
            warnings.extend(self.robot.warnings())
        if self._viewer_refusal:
            warnings.append(self._viewer_refusal)
        warnings.extend(self._quiet_cameras())
        return tuple(warnings)

    def _quiet_cameras(self) -> list[str]:
        """A rig's cameras without an image for stale_after_s while another camera sends (the
        others go on mapping; the node as a whole is STALE only when every camera is quiet)."""
        if self.cfg is None or not self.cfg.stale_after_s or self._state_machine.current_state[1] != "active":
            return []
        now = time.monotonic()
        quiet = {camera: counters.last_received_s for camera, counters in self.camera_counters.items()
                 if counters.last_received_s is None or now - counters.last_received_s > self.cfg.stale_after_s}
        if len(quiet) == len(self.camera_counters):
            return []
        texts = []
        for camera, last in quiet.items():
            inputs = self.camera_inputs.get(camera)
            topic = inputs.image_topic if inputs is not None else f"~/{camera}/image"
            quiet_for = "yet" if last is None else f"for {now - last:.1f} s"
            texts.append(f"camera {camera}: no image on {topic} {quiet_for} (the other cameras go on mapping)")
        return texts

    def lifecycle_text(self) -> str:
        label = self._state_machine.current_state[1]
        return "" if label == "active" else {
            "inactive": "inactive: the stream is paused and resumes where it stopped at activate",
            "unconfigured": "unconfigured: no model loaded (configure to start)"}.get(label, label)

    def _last_stamp(self, snapshot):
        """The last processed image's stamp, or now before any image."""
        if snapshot.last_stamp_ns is None:
            return self.get_clock().now().to_msg()
        return messages.stamp_msg(snapshot.last_stamp_ns)

    def status_message(self, mapper=None):
        snapshot = (mapper or self.mapper).snapshot
        stamp = self._last_stamp(snapshot)
        msg = fill_status(MapStatus(), snapshot, self.counters.snapshot(), self.counters, stamp,
                          self.cfg.map_frame, self.lifecycle_text())
        mapper = mapper or self.mapper
        if isinstance(mapper, RigFront):   # the numbers are the primary camera's; each camera's state here
            msg.state_text += "; " + camera_summary(mapper)
        return msg

    def publish_status(self) -> None:
        # Any thread; the mapper reference is taken once, since cleanup may clear it meanwhile.
        mapper = self.mapper
        with self._outputs_lock:
            outputs = self.outputs
            if outputs is not None and outputs.status is not None and mapper is not None and self.context.ok():
                outputs.status.publish(self.status_message(mapper))

    # -- timers -------------------------------------------------------------------------------

    def _start_timers(self) -> None:
        for timer in self._own_timers:
            self.destroy_timer(timer)
        cfg, group = self.cfg, self._timer_group
        self._own_timers = []
        if cfg.map_publish_period_s > 0:
            self._own_timers.append(self.create_timer(cfg.map_publish_period_s,
                                                      self.safety.guard("map timer", self._on_map_timer),
                                                      callback_group=group))

    def _start_viewer(self) -> None:
        """The live view (viewer_port): a refusal (port in use, viser missing) is an error in the
        log and a WARN in /diagnostics; mapping goes on without the view."""
        self._viewer_refusal = ""
        if not self.cfg.viewer_port:
            return
        try:
            self.viewer = LiveView(self.cfg.viewer_port, self.cfg.viewer_point_budget)
        except ViewerError as error:
            self._viewer_refusal = f"live view off: {error}"
            self.get_logger().error(f"{self._viewer_refusal}; mapping goes on")
            return
        self.get_logger().info(f"live view: {self.viewer.url}")

    def _on_diagnostics_timer(self) -> None:
        mapper, bundle, inputs, cfg = self.mapper, self.bundle, self.inputs, self.cfg or params.NodeSettings()
        snapshot = mapper.snapshot if mapper is not None else None
        counters = self.counters
        if snapshot is not None and snapshot.map_database_error != self._logged_database_error:
            self._logged_database_error = snapshot.map_database_error
            if snapshot.map_database_error:
                self.get_logger().warning(f"map database: {snapshot.map_database_error}; mapping goes on in memory")
        extra = {"camera_info": inputs.camera_info_k if inputs else ""} if cfg.use_camera_info else {}
        if cfg.use_camera_info and self.camera_inputs:   # a rig: each camera's
            extra = {f"camera_info {camera}": inputs.camera_info_k for camera, inputs in self.camera_inputs.items()}
        if bundle is not None:
            extra["model"] = bundle.description + (" (RANDOM WEIGHTS: not a map)" if bundle.random_weights else "")
        robot = self.robot
        conflict = robot.conflict if robot is not None else None
        if robot is not None:
            extra.update(robot.describe())
        if isinstance(mapper, RigFront):
            self._refresh_scales()
            now = time.monotonic()
            extra.update(camera_lines(mapper, {camera: c.snapshot() for camera, c in self.camera_counters.items()},
                                      {camera: None if c.last_received_s is None else now - c.last_received_s
                                       for camera, c in self.camera_counters.items()}))
        refusals = dict(counters.last_refusal)
        report = self.health.update(time.monotonic(), totals(snapshot, counters.snapshot()), Facts(
            self._state_machine.current_state[1], bundle is not None and bundle.random_weights,
            self.configure_error, counters.last_received_s, conflict.message if conflict else "",
            refusals.get("callback_errors", ""), self.input_warnings(),
            snapshot.map_database_error if snapshot is not None else "", refusals), Limits.of(cfg))
        self._diagnostics.publish(diagnostic_array(
            self.get_clock().now().to_msg(), self.get_name(), self.get_fully_qualified_name(), report, snapshot,
            counters, bundle.device if bundle is not None else "cpu", self.lifecycle_text(), extra))
        self.publish_status()

    def _refresh_scales(self) -> None:
        """The rig's scales for the next diagnostics, on the worker (it reads the cameras'
        trajectories); coalesced: one refresh waits at most."""
        worker, mapper = self.worker, self.mapper
        if worker is not None and isinstance(mapper, RigFront) and not self._scales_pending.is_set():
            self._scales_pending.set()

            def refresh() -> None:
                self._scales_pending.clear()
                mapper.refresh_scales()
            worker.submit(self.safety.guard("rig scales", refresh))

    def _on_map_timer(self) -> None:
        with self._outputs_lock:
            worker, outputs = self.worker, self.outputs
            # Coalesced: while one publication waits for the worker, a tick adds nothing (a tiny
            # period queued one per tick without bound, delaying services by seconds).
            if (worker is not None and outputs is not None and outputs.map.get_subscription_count()
                    and not self._map_publish_pending.is_set()):
                self._map_publish_pending.set()
                # Guarded: an error on the worker (a non-finite map) is logged and counted, not lost.
                worker.submit(self.safety.guard("map publication", self.publish_map))

    def publish_map(self) -> None:
        self._map_publish_pending.clear()
        xyz, rgb = self.mapper.map_points()
        stamp = self._last_stamp(self.mapper.snapshot)
        self.outputs.cloud(xyz, rgb, stamp, self.cfg.map_frame)

    # -- parameters ---------------------------------------------------------------------------

    def _on_set_parameters(self, parameters):
        return params.on_set(self, parameters)

    def apply_live(self, cfg: params.NodeSettings) -> None:
        """New values of the node's parameters (validated; only LIVE ones may differ while
        active): take effect now where the node is configured, else at configure."""
        period = self.cfg.map_publish_period_s
        self._diagnostics_timer.timer_period_ns = round(cfg.diagnostics_period_s * 1e9)   # may raise: first
        self.cfg = cfg
        if self.path is None:   # not configured: configure reads them
            return
        self.path.max_length = cfg.path_max_length
        if period != cfg.map_publish_period_s:
            self._start_timers()
