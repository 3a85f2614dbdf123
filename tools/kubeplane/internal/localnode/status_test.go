package localnode

import (
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestStatusFollowsTheProcess(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img"}}}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		state     podState
		phase     corev1.PodPhase
		ready     bool
		container string // running, waiting:REASON, terminated:CODE:REASON
	}{
		{"accepted", podState{podIP: "127.0.11.2", accepted: t0}, corev1.PodPending, false, "waiting:ContainerCreating"},
		{"started without probe", podState{accepted: t0, started: t0, ready: true}, corev1.PodRunning, true, "running"},
		{"started, probe not passed", podState{accepted: t0, started: t0}, corev1.PodRunning, false, "running"},
		{"exit 0", podState{accepted: t0, started: t0, exited: true, finished: t0}, corev1.PodSucceeded, false, "terminated:0:Completed"},
		{"exit 3", podState{accepted: t0, started: t0, exited: true, exitCode: 3, finished: t0}, corev1.PodFailed, false, "terminated:3:Error"},
		{"killed", podState{accepted: t0, started: t0, exited: true, exitCode: 137, signal: syscall.SIGKILL}, corev1.PodFailed, false, "terminated:137:Error"},
		{"never started", podState{accepted: t0, failed: true, waitReason: "UnsupportedVolume", waitMessage: "m"}, corev1.PodFailed, false, "waiting:UnsupportedVolume"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := status(pod, tt.state)
			if st.Phase != tt.phase {
				t.Errorf("phase %s, want %s", st.Phase, tt.phase)
			}
			var podReady bool
			for _, c := range st.Conditions {
				if c.Type == corev1.PodReady {
					podReady = c.Status == corev1.ConditionTrue
				}
			}
			if podReady != tt.ready || st.ContainerStatuses[0].Ready != tt.ready {
				t.Errorf("ready %v/%v, want %v", podReady, st.ContainerStatuses[0].Ready, tt.ready)
			}
			if got := describeState(st.ContainerStatuses[0].State); got != tt.container {
				t.Errorf("container state %s, want %s", got, tt.container)
			}
			if st.HostIP != "127.0.0.1" {
				t.Errorf("host IP %q", st.HostIP)
			}
		})
	}
}

func describeState(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running"
	case s.Waiting != nil:
		return "waiting:" + s.Waiting.Reason
	case s.Terminated != nil:
		return "terminated:" + strconv.Itoa(int(s.Terminated.ExitCode)) + ":" + s.Terminated.Reason
	}
	return "none"
}
