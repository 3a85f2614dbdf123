package localnode

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probeReadiness runs the readiness probe as a kubelet does, at its period
// after its initial delay, and sets the Pod Ready after successThreshold
// passes in a row and not Ready after failureThreshold failures in a row.
// httpGet and tcpSocket probes are run; others count as passing.
func (r *podRun) probeReadiness(ctx context.Context, pr *corev1.Probe) {
	period := seconds(pr.PeriodSeconds, 10)
	timeout := seconds(pr.TimeoutSeconds, 1)
	success := int(max(pr.SuccessThreshold, 1))
	failure := int(max(pr.FailureThreshold, 3))
	r.p.mu.Lock()
	podIP := r.state.podIP
	c := r.pod.Spec.Containers[0].DeepCopy()
	r.p.mu.Unlock()
	if pr.HTTPGet == nil && pr.TCPSocket == nil {
		r.log.Warn("only httpGet and tcpSocket readiness probes are run by the stand-in node; this one counts as passing")
		r.p.setState(r, func(s *podState) { s.ready = true })
		return
	}
	select {
	case <-time.After(time.Duration(pr.InitialDelaySeconds) * time.Second):
	case <-ctx.Done():
		return
	}
	ready, passes, fails := false, 0, 0
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		err := probeOnce(ctx, pr, c, podIP, timeout)
		if err == nil {
			passes, fails = passes+1, 0
		} else {
			passes, fails = 0, fails+1
		}
		switch {
		case !ready && passes >= success:
			ready = true
			r.log.Info("readiness probe passes")
			r.p.setState(r, func(s *podState) { s.ready = true })
		case ready && fails >= failure:
			ready = false
			r.log.Info("readiness probe fails", "err", err)
			r.p.setState(r, func(s *podState) { s.ready = false })
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func seconds(n, dflt int32) time.Duration {
	if n <= 0 {
		n = dflt
	}
	return time.Duration(n) * time.Second
}

// probeOnce runs one probe attempt against the Pod at podIP.
func probeOnce(ctx context.Context, pr *corev1.Probe, c *corev1.Container, podIP string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if g := pr.TCPSocket; g != nil {
		port, err := probePort(g.Port, c)
		if err != nil {
			return err
		}
		host := g.Host
		if host == "" {
			host = podIP
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	}
	g := pr.HTTPGet
	port, err := probePort(g.Port, c)
	if err != nil {
		return err
	}
	host := g.Host
	if host == "" {
		host = podIP
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port)), Path: g.Path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	for _, h := range g.HTTPHeaders {
		req.Header.Add(h.Name, h.Value)
	}
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // as a kubelet: probes do not verify
		DisableKeepAlives: true,
	}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("readiness probe got HTTP %d", resp.StatusCode)
	}
	return nil
}

// probePort resolves a probe's port, by number or by the container port's name.
func probePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("probe port %q names no container port", p.StrVal)
}
