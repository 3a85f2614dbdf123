package main

import (
	"time"

	"github.com/apiary-llm/apiary/internal/imagefetch"
	"github.com/apiary-llm/apiary/internal/routing"
	"github.com/spf13/pflag"
)

// routingFlags are the flags of `apiary queen` for inference routing and
// placement on demand; config turns them into a routing.Config.
type routingFlags struct {
	routing                      string
	affinityTTL, queueTimeout    time.Duration
	swapWait, minResidency       time.Duration
	scaleUpAfter, modelsRefresh  time.Duration
	queueSize, maxWorkers, slots int
	strikeLimit                  int
	modelMaxWorkers              map[string]int
	crashLoopFailures            int
	crashLoopWindow              time.Duration
	crashLoopBackoff, stable     time.Duration
	imageFetch, imageFetchLAN    bool
}

func (r *routingFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&r.routing, "routing", routing.RoutePrefix, "how a worker is chosen: prefix (the one whose cache holds most of the request's prompt, unless its load makes a colder one faster) or least-loaded")
	fl.DurationVar(&r.affinityTTL, "affinity-ttl", routing.DefaultAffinityTTL, "an X-Session-Id stays pinned to its worker this long after its last request")
	fl.IntVar(&r.queueSize, "queue-size", routing.DefaultQueueSize, "requests of one model that may wait for a worker; one more gets 429")
	fl.DurationVar(&r.queueTimeout, "queue-timeout", routing.DefaultQueueTimeout, "longest wait for a worker (cold starts included); then 504")
	fl.DurationVar(&r.swapWait, "swap-wait", routing.DefaultSwapWait, "how long a request waits for busy workers of other models to finish when only they hold the memory its model needs (then 503)")
	fl.DurationVar(&r.minResidency, "min-residency", routing.DefaultMinResidency, "on a device that swapped models twice within a minute, a worker is not evicted before it has been ready as long as it took to load, and at least this long (at most half of --swap-wait): requests for the other model wait")
	fl.DurationVar(&r.scaleUpAfter, "scale-up-after", routing.DefaultScaleUpAfter, "place one more worker of a model when its oldest waiting request waited this long")
	fl.IntVar(&r.maxWorkers, "max-workers", routing.DefaultMaxWorkers, "live workers of each model at most (operators' included) when placing on demand")
	fl.StringToIntVar(&r.modelMaxWorkers, "model-max-workers", nil, "max workers per model, e.g. tiny=2,big=1 (0: never placed on demand)")
	fl.IntVar(&r.slots, "worker-slots", routing.DefaultWorkerSlots, "requests sent to one worker at once: the workers' --slots (hives set it with --worker-slots)")
	fl.DurationVar(&r.modelsRefresh, "models-refresh", routing.DefaultModelsRefresh, "how often the hives' model lists are read again")
	fl.IntVar(&r.strikeLimit, "strike-limit", routing.DefaultStrikeLimit, "requests in a row a worker may fail (connection refused or broken, 5xx other than 503) before it gets no new requests; at 3 times as many the queen stops it")
	fl.IntVar(&r.crashLoopFailures, "crashloop-failures", routing.DefaultCrashLoopFailures, "failures of a model with min workers within --crashloop-window that make a crash loop")
	fl.DurationVar(&r.crashLoopWindow, "crashloop-window", routing.DefaultCrashLoopWindow, "window of --crashloop-failures")
	fl.DurationVar(&r.crashLoopBackoff, "crashloop-backoff", routing.DefaultCrashLoopBackoff, "a model in a crash loop is replaced at most this often")
	fl.BoolVar(&r.imageFetch, "image-fetch", true, "fetch the pictures requests name by http(s) URL (public addresses only, 20 MiB each) and hand them to the worker inline; false: such requests get 400")
	fl.BoolVar(&r.imageFetchLAN, "image-fetch-private", false, "let --image-fetch reach loopback, private and link-local addresses too (pictures on an intranet host; any API client can then make the queen fetch from its network)")
	fl.DurationVar(&r.stable, "stable-after", routing.DefaultStableAfter, "a worker serving this long ends its model's replacement backoff and crash loop")
}

// config is the routing settings as the flags give them; the queen
// checks them (routing.Config.Validate).
func (r *routingFlags) config() routing.Config {
	var images *imagefetch.Fetcher
	if r.imageFetch {
		images = imagefetch.New(imagefetch.Fetcher{AllowPrivate: r.imageFetchLAN})
	}
	return routing.Config{Images: images, Routing: r.routing, AffinityTTL: r.affinityTTL, QueueSize: r.queueSize, QueueTimeout: r.queueTimeout, SwapWait: r.swapWait, MinResidency: r.minResidency,
		ScaleUpAfter: r.scaleUpAfter, MaxWorkers: r.maxWorkers, ModelMaxWorkers: r.modelMaxWorkers,
		WorkerSlots: r.slots, ModelsRefresh: r.modelsRefresh, StrikeLimit: r.strikeLimit, CrashLoopFailures: r.crashLoopFailures,
		CrashLoopWindow: r.crashLoopWindow, CrashLoopBackoff: r.crashLoopBackoff, StableAfter: r.stable}
}
