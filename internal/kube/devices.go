package kube

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/apiary-llm/apiary/internal/gpu"
)

// ResourceGPU is the extended resource NVIDIA's device plugin advertises.
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"

// LabelGPUMemory is the label NVIDIA's GPU feature discovery puts on a
// node: the memory of each of its GPUs, in MiB.
const LabelGPUMemory = "nvidia.com/gpu.memory"

// deviceKey is one device of the cluster: a node's CPU (gpu -1) or one of
// its GPUs.
type deviceKey struct {
	node string
	gpu  int
}

// deviceIDs numbers the cluster's devices in the order first seen, so
// that a device keeps its id while the hive runs, whatever nodes come and
// go. Bounded by the nodes the cluster ever had times their GPUs.
type deviceIDs struct {
	byKey map[deviceKey]int
	keys  []deviceKey // by id
}

func (d *deviceIDs) id(k deviceKey) int {
	if d.byKey == nil {
		d.byKey = map[deviceKey]int{}
	}
	id, ok := d.byKey[k]
	if !ok {
		id = len(d.keys)
		d.byKey[k] = id
		d.keys = append(d.keys, k)
	}
	return id
}

// Placement is where a device puts a worker Pod: on a node, on its CPU or
// on GPUs.
type Placement struct {
	Node string
	GPUs int // 0: the CPU
}

// Devices are the devices of every node that takes Pods (Ready, not
// cordoned): its CPU with the node's allocatable memory, and each of its
// GPUs (nvidia.com/gpu) with the memory the node's nvidia.com/gpu.memory
// label gives. Free is what Pods that are not this installation's workers
// leave (their memory requests, their GPUs); the hive counts its own.
func (c *Cluster) Devices(context.Context) ([]gpu.Device, error) {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	pods, err := c.allPods.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	type others struct {
		mem  int64
		gpus int64
	}
	held := map[string]others{}
	for _, p := range pods {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || c.ours(p) {
			continue
		}
		o := held[p.Spec.NodeName]
		for _, ct := range p.Spec.Containers {
			o.mem += ct.Resources.Requests.Memory().Value()
			if q, ok := ct.Resources.Limits[ResourceGPU]; ok {
				o.gpus += q.Value()
			}
		}
		held[p.Spec.NodeName] = o
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var devs []gpu.Device
	for _, n := range nodes {
		why := unschedulable(n)
		o := held[n.Name]
		if q, ok := n.Status.Allocatable[ResourceGPU]; ok && q.Value() > 0 {
			perGPU, err := gpuMemory(n)
			for i := range int(q.Value()) {
				d := gpu.Device{ID: c.devices.id(deviceKey{n.Name, i}), Kind: gpu.KindCUDA,
					Name: fmt.Sprintf("%s GPU %d", n.Name, i), TotalBytes: perGPU, FreeBytes: perGPU, Unusable: why}
				switch {
				case err != nil && d.Unusable == "":
					d.Unusable = err.Error()
				case int64(i) >= q.Value()-o.gpus:
					d.FreeBytes = 0 // another Pod's
				}
				devs = append(devs, d)
			}
		}
		mem := n.Status.Allocatable.Memory().Value()
		devs = append(devs, gpu.Device{ID: c.devices.id(deviceKey{n.Name, -1}), Kind: gpu.KindCPU, Name: n.Name,
			TotalBytes: uint64(max(mem, 0)), FreeBytes: uint64(max(mem-o.mem, 0)), Unusable: why})
	}
	return devs, nil
}

// Place is where device id puts a worker; ok is false for an id the
// cluster never had.
func (c *Cluster) Place(id int) (Placement, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id < 0 || id >= len(c.devices.keys) {
		return Placement{}, false
	}
	k := c.devices.keys[id]
	if k.gpu < 0 {
		return Placement{Node: k.node}, true
	}
	return Placement{Node: k.node, GPUs: 1}, true
}

// deviceOf is the id of the device a Pod of ours runs on (adoption): the
// node's CPU, or its first GPU.
func (c *Cluster) deviceOf(node string, gpus int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gpus > 0 {
		return c.devices.id(deviceKey{node, 0})
	}
	return c.devices.id(deviceKey{node, -1})
}

// unschedulable says why no worker goes on n ("": it may).
func unschedulable(n *corev1.Node) string {
	if n.Spec.Unschedulable {
		return "node " + n.Name + " is cordoned"
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status != corev1.ConditionTrue {
			return "node " + n.Name + " is not Ready: " + cond.Message
		}
	}
	return ""
}

func gpuMemory(n *corev1.Node) (uint64, error) {
	v, ok := n.Labels[LabelGPUMemory]
	if !ok {
		return 0, fmt.Errorf("node %s has GPUs but no %s label (their memory in MiB, as GPU feature discovery sets it)", n.Name, LabelGPUMemory)
	}
	mib, err := strconv.ParseUint(v, 10, 32)
	if err != nil || mib == 0 {
		return 0, fmt.Errorf("node %s: label %s=%q is not a memory in MiB", n.Name, LabelGPUMemory, v)
	}
	return mib << 20, nil
}

// ours reports whether p is a worker Pod of this installation.
func (c *Cluster) ours(p *corev1.Pod) bool {
	return p.Namespace == c.cfg.Namespace && c.selector().AsSelector().Matches(labels.Set(p.Labels))
}

func quantity(n uint64) resource.Quantity { return *resource.NewQuantity(int64(n), resource.BinarySI) }
