# The {stage} stage: a StatefulSet, so each pod's stable name is its worker id: its
# transactional id (a restarted pod fences its former self), its static group membership
# (restarted within the session timeout, it takes its own partitions back with no
# rebalance) and the name of its local state. Scaled by KEDA on its group's lag, never past
# the partition count (a member beyond it would hold no partition).
apiVersion: v1
kind: Service
metadata:
  name: crawlfleet-{stage}
  labels:
    app.kubernetes.io/name: crawlfleet
    app.kubernetes.io/component: {stage}
spec:
  clusterIP: None  # headless: stable pod names, metrics scraped per pod
  selector:
    app.kubernetes.io/name: crawlfleet
    app.kubernetes.io/component: {stage}
  ports:
    - name: metrics
      port: 9400
      targetPort: metrics
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: crawlfleet-{stage}
  labels:
    app.kubernetes.io/name: crawlfleet
    app.kubernetes.io/component: {stage}
spec:
  serviceName: crawlfleet-{stage}
  replicas: {replicas}  # {scale_note}
  podManagementPolicy: Parallel  # workers are peers: no ordered start needed
  selector:
    matchLabels:
      app.kubernetes.io/name: crawlfleet
      app.kubernetes.io/component: {stage}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: crawlfleet
        app.kubernetes.io/component: {stage}
      annotations:
        prometheus.io/scrape: "true"
        prometheus.io/port: "9400"
    spec:
      # A clean stop commits finished work and closes the consumer: it needs the
      # transaction timeout (= session timeout, 30 s) at worst, plus the margin.
      terminationGracePeriodSeconds: 60
      # The image runs as 65534; fsGroup makes the state volume writable by it (the pod's
      # data dir is that volume).
      securityContext:
        runAsUser: 65534
        runAsGroup: 65534
        runAsNonRoot: true
        fsGroup: 65534
        fsGroupChangePolicy: OnRootMismatch
      containers:
        - name: {stage}
          image: crawlfleet:0.1.0
          args: ["worker", "{stage}", "--worker-id", "$(POD_NAME)"]
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
          envFrom:
            - configMapRef:
                name: crawlfleet-config
            - secretRef:
                name: crawlfleet-secrets
          ports:
            - name: metrics
              containerPort: 9400
          # Ready = joined its group, its partitions' state restored, consuming (the
          # worker's own status, streams/readiness.py): a rolling update moves on only
          # then. 503 with the reason meanwhile (waiting for Kafka, restoring ...).
          readinessProbe:
            httpGet:
              path: /ready
              port: metrics
            periodSeconds: 5
            failureThreshold: 2
          # Alive = the metrics page answers: also while the worker waits for Kafka or
          # its store, which it survives (crawlfleet_kafka_waiting / _store_waiting).
          livenessProbe:
            httpGet:
              path: /metrics
              port: metrics
            initialDelaySeconds: 30
            periodSeconds: 20
            failureThreshold: 6
          resources:
            requests:
              cpu: {cpu}
              memory: {memory}
            limits:
              memory: {memory}
          volumeMounts:
            - name: state
              mountPath: /var/lib/crawlfleet
  # Local state (dedupe keys, parked jobs, timers) survives a restart: only the
  # changelog's tail is read back.
  volumeClaimTemplates:
    - metadata:
        name: state
      spec:
        accessModes: ["ReadWriteOnce"]
        resources:
          requests:
            storage: {disk}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: crawlfleet-{stage}
spec:
  maxUnavailable: 1  # a drain moves one worker at a time: one rebalance, not a storm
  selector:
    matchLabels:
      app.kubernetes.io/name: crawlfleet
      app.kubernetes.io/component: {stage}
---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: crawlfleet-{stage}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: StatefulSet
    name: crawlfleet-{stage}
  minReplicaCount: 1
  maxReplicaCount: {partitions}  # = CRAWLFLEET_PARTITIONS: a member beyond it holds nothing
  cooldownPeriod: 300  # scale down slowly: each change is a (cooperative) rebalance
  triggers:
    - type: kafka
      metadata:
        bootstrapServers: kafka-0.kafka:9092,kafka-1.kafka:9092,kafka-2.kafka:9092
        consumerGroup: prod.crawlfleet-{stage}  # every topic the group reads: all its inputs
        # {lag_note}
        lagThreshold: "{lag}"
        offsetResetPolicy: earliest  # as the consumers: a group with no offset lags it all
        allowIdleConsumers: "false"
