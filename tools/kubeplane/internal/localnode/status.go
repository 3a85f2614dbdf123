package localnode

import (
	"fmt"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// hostIP is every Pod's host IP: the nodes are processes on this host.
const hostIP = "127.0.0.1"

// podState is what the node knows of one Pod; status derives the
// PodStatus a kubelet would report from it.
type podState struct {
	podIP    string
	accepted time.Time // when the node took the Pod: status.startTime

	// waitReason and waitMessage say why the container has not started
	// (and, with phase Failed and no exit, never will).
	waitReason, waitMessage string

	started time.Time // zero until the process runs
	ready   bool      // the readiness probe passes (or there is none)

	exited   bool
	exitCode int            // 128+signal when a signal ended it
	signal   syscall.Signal // the signal that ended it, or 0
	finished time.Time

	failed bool // the Pod failed before its process could start
	// note goes to status.message (restartPolicy treated as Never).
	note string
}

// phase is the Pod phase of s.
func (s podState) phase() corev1.PodPhase {
	switch {
	case s.failed:
		return corev1.PodFailed
	case s.exited && s.exitCode == 0:
		return corev1.PodSucceeded
	case s.exited:
		return corev1.PodFailed
	case !s.started.IsZero():
		return corev1.PodRunning
	}
	return corev1.PodPending
}

// terminal reports whether the Pod will never run again.
func (s podState) terminal() bool { return s.failed || s.exited }

// status is the PodStatus of pod in state s.
func status(pod *corev1.Pod, s podState) corev1.PodStatus {
	st := corev1.PodStatus{
		Phase:    s.phase(),
		HostIP:   hostIP,
		HostIPs:  []corev1.HostIP{{IP: hostIP}},
		QOSClass: pod.Status.QOSClass,
		Message:  s.note,
	}
	if s.podIP != "" {
		st.PodIP = s.podIP
		st.PodIPs = []corev1.PodIP{{IP: s.podIP}}
	}
	if !s.accepted.IsZero() {
		t := metav1.NewTime(s.accepted)
		st.StartTime = &t
	}
	if s.failed {
		st.Reason, st.Message = s.waitReason, s.waitMessage
	}
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(s.accepted)}
		if ok {
			c.Status = corev1.ConditionTrue
		}
		return c
	}
	running := !s.started.IsZero() && !s.exited
	ready := running && s.ready
	st.Conditions = []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, !s.terminal()),
		cond(corev1.PodInitialized, true),
		cond(corev1.ContainersReady, ready),
		cond(corev1.PodReady, ready),
		cond(corev1.PodScheduled, true),
	}
	if len(pod.Spec.Containers) == 0 {
		return st
	}
	c := pod.Spec.Containers[0]
	cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: ready, Started: &running}
	switch {
	case s.exited:
		reason := "Completed"
		if s.exitCode != 0 {
			reason = "Error"
		}
		cs.State.Terminated = &corev1.ContainerStateTerminated{
			ExitCode:   int32(s.exitCode),
			Signal:     int32(s.signal),
			Reason:     reason,
			StartedAt:  metav1.NewTime(s.started),
			FinishedAt: metav1.NewTime(s.finished),
		}
		if s.signal != 0 {
			cs.State.Terminated.Message = fmt.Sprintf("killed by signal %d (%s)", int(s.signal), s.signal)
		}
		cs.ContainerID = "kubeplane://" + string(pod.UID)
	case running:
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(s.started)}
		cs.ContainerID = "kubeplane://" + string(pod.UID)
	default:
		reason := s.waitReason
		if reason == "" {
			reason = "ContainerCreating"
		}
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: s.waitMessage}
	}
	st.ContainerStatuses = []corev1.ContainerStatus{cs}
	return st
}
